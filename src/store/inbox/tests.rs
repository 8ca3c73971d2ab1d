use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};

use super::*;

fn request() -> StoredRequest {
    StoredRequest::new(
        Method::POST,
        "/webhooks/stripe?x=1",
        vec![
            (
                HeaderName::from_static("stripe-signature"),
                HeaderValue::from_static("t=1,v1=ab"),
            ),
            (
                HeaderName::from_static("x-many"),
                HeaderValue::from_static("a"),
            ),
            (
                HeaderName::from_static("x-many"),
                HeaderValue::from_bytes(b"\xffb").unwrap(),
            ),
        ],
        Bytes::from_static(b"{\"id\":\"evt_1\"}\0\xff"),
    )
}

#[test]
fn a_request_reads_back_as_written() {
    let stored = request();
    let bytes = stored.encode();
    assert_eq!(StoredRequest::decode(&bytes).unwrap(), stored);
    let map = stored.header_map();
    assert_eq!(map.get_all("x-many").iter().count(), 2);
}

#[test]
fn a_damaged_request_is_an_error_not_a_panic() {
    let bytes = request().encode();
    for cut in 0..bytes.len() {
        assert!(
            StoredRequest::decode(&bytes[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(StoredRequest::decode(&longer).is_err());
    let mut retagged = bytes;
    retagged[3] = b'9';
    assert!(StoredRequest::decode(&retagged).is_err());
}

#[test]
fn a_history_keeps_its_latest_attempts() {
    let attempts: Vec<Attempt> = (0..(HISTORY_LIMIT as u64 + 5))
        .map(|n| {
            let result = match n % 3 {
                0 => AttemptResult::Status(500),
                1 => AttemptResult::Error("é".repeat(400)),
                _ => AttemptResult::Crashed,
            };
            Attempt::new(n, n * 10, result)
        })
        .collect();
    let read = Attempt::decode_history(&Attempt::encode_history(&attempts)).unwrap();
    assert_eq!(read.len(), HISTORY_LIMIT);
    assert_eq!(read[0].started_ms, 5);
    assert_eq!(read.last().unwrap().started_ms, HISTORY_LIMIT as u64 + 4);
    // A long error text is cut on a character boundary (the first kept attempt that failed
    // with one is the third: 7 % 3 == 1).
    let AttemptResult::Error(text) = &read[2].result else {
        panic!("{:?}", read[2]);
    };
    assert!(text.len() <= 512 && text.chars().all(|c| c == 'é'));
    assert_eq!(Attempt::decode_history(&[]).unwrap(), Vec::new());
    assert!(Attempt::decode_history(b"TIH1\0\x01").is_err());
}

#[test]
fn states_read_back_as_written() {
    for state in [
        EntryState::Queued,
        EntryState::Running,
        EntryState::Done,
        EntryState::Dead,
    ] {
        assert_eq!(EntryState::parse(state.as_str()), Some(state));
    }
    assert_eq!(EntryState::parse("processing"), None);
}

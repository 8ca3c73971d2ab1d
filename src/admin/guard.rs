//! The refusal of requests another site makes an operator's browser send (see the [module
//! documentation](super#cross-site-requests-are-refused)).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Method, StatusCode};

use super::problem::Problem;

/// Lets through `GET` and `HEAD`, and other methods only as JSON that no other site sent.
pub(super) async fn refuse_cross_site(req: Request, next: Next) -> Response {
    if req.method() == Method::GET || req.method() == Method::HEAD {
        return next.run(req).await;
    }
    match check(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(problem) => problem.into_response(),
    }
}

/// The checks on the head of a request that may change something.
fn check(headers: &HeaderMap) -> Result<(), Problem> {
    // `none` is a request the user made (typed, bookmarked); no header at all is a client
    // that is not a browser, or one too old to send it (which the content type still covers).
    match headers.get("sec-fetch-site").map(|site| site.as_bytes()) {
        None | Some(b"same-origin" | b"none") => {}
        Some(_) => {
            return Err(Problem::new(
                StatusCode::FORBIDDEN,
                "refused: the browser says another site sent this request (Sec-Fetch-Site)",
            ));
        }
    }
    if !is_json(headers) {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be Content-Type: application/json",
        ));
    }
    Ok(())
}

/// Whether the content type is `application/json`, parameters (`charset`) aside. Only the
/// first `Content-Type` counts, as for every other reader of the request.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    fn status(pairs: &[(&'static str, &'static str)]) -> Option<StatusCode> {
        check(&headers(pairs)).err().map(|problem| problem.status())
    }

    #[test]
    fn json_from_the_same_origin_or_no_browser_passes() {
        assert_eq!(status(&[("content-type", "application/json")]), None);
        assert_eq!(
            status(&[("content-type", "Application/JSON; charset=utf-8")]),
            None
        );
        for site in ["same-origin", "none"] {
            let pairs = [
                ("content-type", "application/json"),
                ("sec-fetch-site", site),
            ];
            assert_eq!(status(&pairs), None, "{site}");
        }
    }

    #[test]
    fn what_a_form_can_send_is_415() {
        for ty in [
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "text/plain",
            "text/plain; application/json",
            "application/jsonp",
        ] {
            let expected = Some(StatusCode::UNSUPPORTED_MEDIA_TYPE);
            assert_eq!(status(&[("content-type", ty)]), expected, "{ty}");
        }
        assert_eq!(status(&[]), Some(StatusCode::UNSUPPORTED_MEDIA_TYPE));
    }

    #[test]
    fn another_site_is_403_whatever_the_content_type() {
        for site in ["cross-site", "same-site", "something-new"] {
            let pairs = [
                ("content-type", "application/json"),
                ("sec-fetch-site", site),
            ];
            assert_eq!(status(&pairs), Some(StatusCode::FORBIDDEN), "{site}");
        }
        let form = [
            ("content-type", "application/x-www-form-urlencoded"),
            ("sec-fetch-site", "cross-site"),
        ];
        assert_eq!(status(&form), Some(StatusCode::FORBIDDEN));
    }
}

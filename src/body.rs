//! The body types the layer passes on and answers with.
//!
//! The inner service receives a [`RequestBody`]: the original body, untouched, when the key
//! came from the headers; the buffered bytes when the extractor had to read the body. Either
//! way it reads the same bytes the client sent. Responses are [`ResponseBody`]: the inner
//! service's body, or one of the layer's own short answers.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::{IdempotencyLayer, body::RequestBody, key, store::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // The handler echoes the body it received.
//! let echo = service_fn(|req: Request<RequestBody<Full<Bytes>>>| async move {
//!     let body = req.into_body().collect().await?.to_bytes();
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(body)))
//! });
//! let svc = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()).key(key::stripe()))
//!     .service(echo);
//!
//! let event = r#"{"id":"evt_1","type":"charge.succeeded"}"#;
//! let res = svc.oneshot(Request::new(Full::new(Bytes::from(event)))).await.unwrap();
//! let echoed = res.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(echoed, event, "the key was read from the body, and the handler got it intact");
//! # }
//! ```

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The request body the inner service receives.
    pub struct RequestBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    /// The response body of the layer's service.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Bytes { data: Option<Bytes> },
    }
}

impl<B> RequestBody<B> {
    /// The original body, passed on untouched.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// A body that was read whole and is replayed from memory.
    pub fn buffered(data: Bytes) -> Self {
        Self {
            kind: Kind::bytes(data),
        }
    }

    /// The bytes of a buffered body not read yet; empty for an empty body or one passed on
    /// untouched.
    pub(crate) fn buffered_bytes(&self) -> &[u8] {
        match &self.kind {
            Kind::Bytes { data: Some(data) } => data,
            _ => &[],
        }
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// One of the layer's own answers.
    pub(crate) fn bytes(data: Bytes) -> Self {
        Self {
            kind: Kind::bytes(data),
        }
    }
}

impl<B> Kind<B> {
    /// Bytes sent as one frame; none at all when empty.
    fn bytes(data: Bytes) -> Self {
        Self::Bytes {
            data: (!data.is_empty()).then_some(data),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for Kind<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Bytes { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Inner { body } => body.is_end_stream(),
            Self::Bytes { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Inner { body } => body.size_hint(),
            Self::Bytes { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

macro_rules! delegate_body {
    ($ty:ident) => {
        impl<B: Body<Data = Bytes>> Body for $ty<B> {
            type Data = Bytes;
            type Error = B::Error;

            fn poll_frame(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
                self.project().kind.poll_frame(cx)
            }

            fn is_end_stream(&self) -> bool {
                self.kind.is_end_stream()
            }

            fn size_hint(&self) -> SizeHint {
                self.kind.size_hint()
            }
        }

        impl<B> fmt::Debug for $ty<B> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let kind = match &self.kind {
                    Kind::Inner { .. } => "inner",
                    Kind::Bytes { .. } => "bytes",
                };
                f.debug_struct(stringify!($ty))
                    .field("kind", &kind)
                    .finish()
            }
        }
    };
}

delegate_body!(RequestBody);
delegate_body!(ResponseBody);

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};

    #[tokio::test]
    async fn buffered_body_replays_its_bytes_once() {
        let body = RequestBody::<Empty<Bytes>>::buffered(Bytes::from_static(b"hello"));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
    }

    #[test]
    fn empty_answer_is_at_its_end() {
        let body = ResponseBody::<Empty<Bytes>>::bytes(Bytes::new());
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }
}

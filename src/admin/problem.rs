//! The router's errors, as `application/problem+json` (RFC 9457), and its JSON answers.

use std::error::Error as _;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, StatusCode};

use crate::store::StoreError;

const JSON: HeaderValue = HeaderValue::from_static("application/json");
/// What the router answers describes claims as they are now: never from a cache.
pub(super) const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// An error answer: its status, and a sentence saying what went wrong.
#[derive(Debug)]
pub(super) struct Problem {
    status: StatusCode,
    detail: String,
}

impl Problem {
    pub(super) fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Self {
            status,
            detail: detail.into(),
        }
    }

    /// 400: a query that does not parse, a body that is no JSON.
    pub(super) fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    /// 422: JSON, but not what the route takes.
    pub(super) fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }

    /// 503: the store failed. The error and its sources are logged and named in the answer,
    /// which only operators see.
    pub(super) fn store(err: StoreError) -> Self {
        let mut detail = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            detail.push_str(": ");
            detail.push_str(&cause.to_string());
            source = cause.source();
        }
        tracing::error!(error = %detail, "admin: the store failed");
        Self::new(StatusCode::SERVICE_UNAVAILABLE, detail)
    }

    #[cfg(test)]
    pub(super) fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<StoreError> for Problem {
    fn from(err: StoreError) -> Self {
        Self::store(err)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = crate::response::problem_json(self.status, &self.detail, None);
        let mut res = Response::new(Body::from(body));
        *res.status_mut() = self.status;
        res.headers_mut()
            .insert(CONTENT_TYPE, crate::response::PROBLEM_JSON);
        res.headers_mut().insert(CACHE_CONTROL, NO_STORE);
        res
    }
}

/// A 200 with `value` as its JSON body.
pub(super) fn json(value: serde_json::Value) -> Response {
    let mut res = Response::new(Body::from(value.to_string()));
    res.headers_mut().insert(CONTENT_TYPE, JSON);
    res.headers_mut().insert(CACHE_CONTROL, NO_STORE);
    res
}

/// The fallback for paths the router does not have.
pub(super) async fn not_found() -> Problem {
    Problem::new(StatusCode::NOT_FOUND, "no such route")
}

/// The fallback for a route asked with a method it does not take.
pub(super) async fn method_not_allowed() -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take this method",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_problem_is_problem_json() {
        let res = Problem::unprocessable("no \"key\" field").into_response();
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "title": "Unprocessable Entity",
                "status": 422,
                "detail": "no \"key\" field",
            })
        );
    }

    #[test]
    fn a_store_failure_names_its_source() {
        let err = StoreError::backend(std::io::Error::other("connection refused"));
        let problem = Problem::store(err);
        assert_eq!(problem.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            problem.detail,
            "the idempotency store failed: connection refused"
        );
    }
}

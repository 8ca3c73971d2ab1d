//! What the run does with an answer that commits, before it commits.

use std::future::Future;

use http::Response;

use crate::body::ResponseBody;
use crate::store::StoredResponse;

/// What the run does with an answer that commits, before it commits: store it for replay, or
/// pass it on. Answers the response to send and what to store of it, if anything.
pub(crate) trait Keep<B>: Send + 'static {
    /// Whether it may store anything: if not, the run does not ask.
    fn stores(&self) -> bool;

    fn keep(
        self,
        res: Response<B>,
    ) -> impl Future<Output = (Response<ResponseBody<B>>, Option<StoredResponse>)> + Send;
}

/// Stores nothing: the modes without replay.
pub(crate) struct Nothing;

impl<B: Send + 'static> Keep<B> for Nothing {
    fn stores(&self) -> bool {
        false
    }

    #[allow(
        clippy::manual_async_fn,
        reason = "the trait names the future's bounds"
    )]
    fn keep(
        self,
        res: Response<B>,
    ) -> impl Future<Output = (Response<ResponseBody<B>>, Option<StoredResponse>)> + Send {
        async move { (res.map(ResponseBody::new), None) }
    }
}

//! Legal transitions: a lifecycle declared once, checked before each change.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};

/// The transitions an entity's state may take, e.g. a subscription's
/// `incomplete → active → cancelled`. Anything not declared is illegal: an `expired`
/// subscription does not become `active` again because a webhook says so.
///
/// A version guard puts deliveries in order; a lifecycle catches what order cannot: a missed
/// event, a sender bug, a state your system does not allow. Staying in the same state is always
/// legal (an update that changed other fields).
///
/// ```
/// use tower_idempotency::version_guard::Lifecycle;
///
/// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// enum Status { Incomplete, Active, PastDue, Cancelled, Expired }
/// use Status::*;
///
/// // Declared once, in a `const` or a `static`: no allocation.
/// const SUBSCRIPTION: Lifecycle<Status> = Lifecycle::from_static(&[
///     (Incomplete, Active),
///     (Incomplete, Expired),
///     (Active, PastDue),
///     (PastDue, Active),
///     (Active, Cancelled),
///     (PastDue, Cancelled),
/// ]);
///
/// assert!(SUBSCRIPTION.check(Incomplete, Active).is_ok());
/// assert!(SUBSCRIPTION.check(Active, Active).is_ok(), "no change is always legal");
/// let illegal = SUBSCRIPTION.check(Expired, Active).unwrap_err();
/// assert_eq!(illegal.to_string(), "illegal transition from Expired to Active");
///
/// // Or built at run time.
/// let trial = Lifecycle::new().allow(Incomplete, Active).allow(Active, Cancelled);
/// assert!(trial.check(Cancelled, Active).is_err());
/// ```
///
/// # Answering an illegal transition
///
/// Refuse it, never apply it. Then choose the answer:
///
/// - **Non-2xx** (the default of [`IllegalTransition::to_response`]: 409 problem+json): the
///   sender retries. Right when the transition may become legal: an earlier event is missing
///   and may still arrive (`incomplete → cancelled` before `incomplete → active` got through).
///   Under [`IdempotencyLayer`](crate::IdempotencyLayer) the key is released, so the retry runs
///   the handler again. A sender that keeps failing disables the endpoint eventually (Stripe
///   after days of failures): watch for it.
/// - **2xx and an alert**: the sender stops. Right when no retry can make it legal (an
///   `expired → active` your system forbids): log or page, store the event for a person, and
///   answer 200, so that the sender neither retries it forever nor disables the endpoint.
#[derive(Clone)]
pub struct Lifecycle<S: Clone + 'static> {
    transitions: Cow<'static, [(S, S)]>,
}

impl<S: Copy + Eq + fmt::Debug + 'static> Lifecycle<S> {
    /// A lifecycle with no transitions yet; add them with [`allow`](Self::allow).
    pub const fn new() -> Self {
        Self {
            transitions: Cow::Borrowed(&[]),
        }
    }

    /// A lifecycle of the `(from, to)` pairs in `transitions`; usable in a `const`.
    pub const fn from_static(transitions: &'static [(S, S)]) -> Self {
        Self {
            transitions: Cow::Borrowed(transitions),
        }
    }

    /// Allows the transition `from → to` as well.
    pub fn allow(mut self, from: S, to: S) -> Self {
        if !self.transitions.contains(&(from, to)) {
            self.transitions.to_mut().push((from, to));
        }
        self
    }

    /// Whether `from → to` is legal: declared, or no change.
    pub fn allows(&self, from: S, to: S) -> bool {
        from == to || self.transitions.contains(&(from, to))
    }

    /// `Ok` if `from → to` is legal; the [`IllegalTransition`] otherwise.
    pub fn check(&self, from: S, to: S) -> Result<(), IllegalTransition<S>> {
        if self.allows(from, to) {
            Ok(())
        } else {
            Err(IllegalTransition { from, to })
        }
    }

    /// The declared transitions.
    pub fn transitions(&self) -> &[(S, S)] {
        &self.transitions
    }
}

impl<S: Copy + Eq + fmt::Debug + 'static> Default for Lifecycle<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Clone + fmt::Debug + 'static> fmt::Debug for Lifecycle<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for (from, to) in self.transitions.iter() {
            list.entry(&format_args!("{from:?} -> {to:?}"));
        }
        list.finish()
    }
}

/// A transition the [`Lifecycle`] does not allow. Refuse the change and report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct IllegalTransition<S> {
    /// The entity's current state.
    pub from: S,
    /// The state the delivery asks for.
    pub to: S,
}

impl<S: fmt::Debug> fmt::Display for IllegalTransition<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "illegal transition from {:?} to {:?}",
            self.from, self.to
        )
    }
}

impl<S: fmt::Debug> std::error::Error for IllegalTransition<S> {}

impl<S: fmt::Debug> IllegalTransition<S> {
    /// The status of [`to_response`](Self::to_response): 409 Conflict, as the change conflicts
    /// with the entity's current state. Non-2xx, so the sender retries: see
    /// [`Lifecycle`](Lifecycle#answering-an-illegal-transition) for when to answer 2xx instead.
    pub const STATUS: StatusCode = StatusCode::CONFLICT;

    /// A 409 `application/problem+json` answer naming both states (by their `Debug` form):
    ///
    /// ```json
    /// {"title":"Conflict","status":409,"detail":"illegal transition from Expired to Active",
    ///  "from":"Expired","to":"Active"}
    /// ```
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        let mut body = crate::response::problem_document(Self::STATUS, &self.to_string());
        body["from"] = format!("{:?}", self.from).into();
        body["to"] = format!("{:?}", self.to).into();
        let mut res = Response::new(B::from(Bytes::from(body.to_string())));
        *res.status_mut() = Self::STATUS;
        res.headers_mut()
            .insert(CONTENT_TYPE, crate::response::PROBLEM_JSON);
        res
    }
}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: fmt::Debug> axum_core::response::IntoResponse for IllegalTransition<S> {
    /// [`IllegalTransition::to_response`].
    fn into_response(self) -> axum_core::response::Response {
        self.to_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Status {
        Incomplete,
        Active,
        PastDue,
        Cancelled,
        Expired,
    }
    use Status::*;

    const SUBSCRIPTION: Lifecycle<Status> = Lifecycle::from_static(&[
        (Incomplete, Active),
        (Incomplete, Expired),
        (Active, PastDue),
        (PastDue, Active),
        (Active, Cancelled),
        (PastDue, Cancelled),
    ]);

    #[test]
    fn legal_and_illegal_transitions() {
        for (from, to) in SUBSCRIPTION.transitions() {
            assert!(SUBSCRIPTION.check(*from, *to).is_ok(), "{from:?} -> {to:?}");
        }
        for state in [Incomplete, Active, PastDue, Cancelled, Expired] {
            assert!(SUBSCRIPTION.allows(state, state));
        }
        for (from, to) in [
            (Expired, Active),
            (Cancelled, Active),
            (Active, Incomplete),
            (Incomplete, Cancelled),
            (Expired, Cancelled),
        ] {
            assert_eq!(
                SUBSCRIPTION.check(from, to),
                Err(IllegalTransition { from, to })
            );
        }
    }

    #[test]
    fn built_at_run_time() {
        let empty = Lifecycle::<Status>::new();
        assert!(empty.check(Active, Cancelled).is_err());
        let lifecycle = empty
            .allow(Incomplete, Active)
            .allow(Active, Cancelled)
            .allow(Active, Cancelled);
        assert_eq!(lifecycle.transitions().len(), 2);
        assert!(lifecycle.check(Incomplete, Active).is_ok());
        assert!(lifecycle.check(Active, Cancelled).is_ok());
        assert!(lifecycle.check(Cancelled, Active).is_err());
        // Extending a static lifecycle copies it.
        let extended = SUBSCRIPTION.clone().allow(Expired, Active);
        assert!(extended.check(Expired, Active).is_ok());
        assert!(SUBSCRIPTION.check(Expired, Active).is_err());
        assert_eq!(
            format!("{lifecycle:?}"),
            "[Incomplete -> Active, Active -> Cancelled]"
        );
    }

    #[test]
    fn problem_response() {
        let illegal = SUBSCRIPTION.check(Expired, Active).unwrap_err();
        let text = illegal.to_string();
        assert_eq!(text, "illegal transition from Expired to Active");
        let err: &dyn std::error::Error = &illegal;
        assert_eq!(err.to_string(), text);

        let res: Response<Vec<u8>> = illegal.to_response();
        assert_eq!(res.status(), StatusCode::CONFLICT);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
        let body: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(body["status"], 409);
        assert_eq!(body["from"], "Expired");
        assert_eq!(body["to"], "Active");
        assert_eq!(body["detail"], text);
    }
}

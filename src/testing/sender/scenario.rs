//! [`Scenario`]: what the sender plays: the tests that find a receiver's bugs.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::testing::Delivery;

/// One way an at-least-once sender delivers, played by [`Sender::run`](super::Sender::run)
/// against an app.
///
/// Sending one webhook and checking the result finds none of the bugs that matter. These do:
///
/// | scenario | what it sends | passes when |
/// |---|---|---|
/// | [`in_a_row`](Self::in_a_row) | the same delivery `copies` times, one after the other | every answer is 2xx, and there is exactly one effect |
/// | [`at_once`](Self::at_once) | `copies` at the same time, each from a task of its own; a copy answered 409 is sent again until it gets a 2xx | every answer is 2xx or 409, and there is exactly one effect |
/// | [`newer_first`](Self::newer_first) | a newer event, then an older one of the same entity | both answers are 2xx, and the state is still the newer one's |
/// | [`hang_up`](Self::hang_up) | the delivery over a socket, hanging up once the app is at work, then again until a 2xx | exactly one effect |
///
/// With several [instances](super::Sender::instances), the copies go to each in turn. In
/// every scenario, the effect of an event must be visible as soon as one of its deliveries
/// is answered 2xx: a sender that got a 2xx never sends again.
///
/// ```
/// use tower_idempotency::testing::{Scenario, sign};
///
/// let paid = sign::stripe("whsec_test").delivery(r#"{"id":"evt_1"}"#).to("/webhooks/stripe");
/// let scenario = Scenario::at_once(&paid, 8);
/// assert_eq!(
///     format!("{scenario:?}"),
///     "Scenario(8 concurrent copies of Stripe delivery of evt_1 (POST /webhooks/stripe))",
/// );
/// ```
pub struct Scenario {
    pub(super) kind: Kind,
}

/// The scenarios, and what each needs.
pub(super) enum Kind {
    InARow {
        delivery: Delivery,
        copies: usize,
    },
    AtOnce {
        delivery: Delivery,
        copies: usize,
    },
    NewerFirst {
        older: Box<Delivery>,
        newer: Box<Delivery>,
        state: ReadState,
    },
    HangUp {
        delivery: Delivery,
        after: Duration,
    },
}

/// Reads the state a version-guarded route writes.
pub(super) type ReadState = Box<dyn Fn() -> BoxFuture<'static, Box<dyn State>> + Send + Sync>;

/// A state read, comparable with another of its type.
pub(super) trait State: Any + Send + fmt::Debug {
    /// Whether `other` is the same state.
    fn same(&self, other: &dyn State) -> bool;
    fn as_any(&self) -> &dyn Any;
}

impl<T: PartialEq + fmt::Debug + Send + 'static> State for T {
    fn same(&self, other: &dyn State) -> bool {
        other
            .as_any()
            .downcast_ref::<T>()
            .is_some_and(|other| self == other)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Scenario {
    /// The same delivery `copies` times in a row, each sent once the one before was
    /// answered: every answer must be 2xx, and the event must have exactly one effect.
    ///
    /// # Panics
    ///
    /// If `copies` is less than 2.
    ///
    /// ```
    /// use tower_idempotency::testing::{Scenario, sign};
    ///
    /// let scenario = Scenario::in_a_row(&sign::github("s").delivery("d-1", "{}"), 3);
    /// assert_eq!(format!("{scenario:?}"), "Scenario(3 copies in a row of GitHub delivery of d-1 (POST /))");
    /// ```
    pub fn in_a_row(delivery: &Delivery, copies: usize) -> Self {
        assert!(
            copies >= 2,
            "a scenario of duplicates sends at least 2 copies"
        );
        Self {
            kind: Kind::InARow {
                delivery: delivery.clone(),
                copies,
            },
        }
    }

    /// `copies` copies of the delivery at the same time, each from a task of its own (and
    /// with several instances, spread over them). Each answer must be 2xx, or 409 while
    /// another copy holds the event, which the sender sends again, as a real one does, until
    /// it is answered 2xx. Then the event must have exactly one effect. This is the test
    /// that catches a missing unique index: copies in a row never meet.
    ///
    /// # Panics
    ///
    /// If `copies` is less than 2.
    ///
    /// ```
    /// use tower_idempotency::testing::{Scenario, sign};
    ///
    /// let scenario = Scenario::at_once(&sign::github("s").delivery("d-1", "{}"), 8);
    /// assert!(format!("{scenario:?}").contains("8 concurrent copies"));
    /// ```
    pub fn at_once(delivery: &Delivery, copies: usize) -> Self {
        assert!(
            copies >= 2,
            "a scenario of duplicates sends at least 2 copies"
        );
        Self {
            kind: Kind::AtOnce {
                delivery: delivery.clone(),
                copies,
            },
        }
    }

    /// Two events of one entity in reverse order: `newer` first, then `older` (a retry that
    /// came back late). `state` reads what the route applied (a status, a version); after
    /// the older event it must still be what the newer one left, and the newer one must have
    /// changed it. Both answers must be 2xx (a version guard answers the older one `200
    /// outdated`).
    ///
    /// The effect count of the [sender](super::Sender::effects) is not used: the two are
    /// different events.
    ///
    /// ```
    /// use tower_idempotency::testing::{Scenario, sign};
    ///
    /// let stripe = sign::stripe("whsec_test");
    /// let active = stripe.delivery(r#"{"id":"evt_1","created":1,"data":{"object":{"status":"active"}}}"#);
    /// let cancelled = stripe.delivery(r#"{"id":"evt_2","created":2,"data":{"object":{"status":"cancelled"}}}"#);
    /// let scenario = Scenario::newer_first(&active, &cancelled, || async { "the status the app stored" });
    /// assert!(format!("{scenario:?}").contains("the newer event, then the older one"));
    /// ```
    pub fn newer_first<F, Fut, T>(older: &Delivery, newer: &Delivery, state: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T> + Send + 'static,
        T: PartialEq + fmt::Debug + Send + 'static,
    {
        let state: ReadState = Box::new(move || {
            let read = state();
            Box::pin(async move { Box::new(read.await) as Box<dyn State> })
        });
        Self {
            kind: Kind::NewerFirst {
                older: Box::new(older.clone()),
                newer: Box::new(newer.clone()),
                state,
            },
        }
    }

    /// A sender that hangs up while the app works on its delivery, then sends it again until
    /// it is answered 2xx: the event must have exactly one effect. Over a real socket: each
    /// instance is served on `127.0.0.1` by hyper, and the sender closes its connection as
    /// soon as the app has started on the request and waits for something (a database, a
    /// timer), which drops the connection's future, as a server does when its client goes.
    /// The sender then tries again every [`retry_every`](super::Sender::retry_every).
    ///
    /// ```
    /// use tower_idempotency::testing::{Scenario, sign};
    ///
    /// let scenario = Scenario::hang_up(&sign::github("s").delivery("d-1", "{}"));
    /// assert!(format!("{scenario:?}").contains("hung up"));
    /// ```
    pub fn hang_up(delivery: &Delivery) -> Self {
        Self::hang_up_after(delivery, Duration::ZERO)
    }

    /// As [`hang_up`](Self::hang_up), the sender waiting `timeout` once the app has started
    /// before it hangs up: its timeout, for a handler that does part of its work before it
    /// first waits.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::testing::{Scenario, sign};
    ///
    /// let scenario = Scenario::hang_up_after(&sign::github("s").delivery("d-1", "{}"), Duration::from_millis(100));
    /// assert!(format!("{scenario:?}").contains("100ms"));
    /// ```
    pub fn hang_up_after(delivery: &Delivery, timeout: Duration) -> Self {
        Self {
            kind: Kind::HangUp {
                delivery: delivery.clone(),
                after: timeout,
            },
        }
    }

    /// The scenario in words, for reports: `8 concurrent copies across 2 instances`.
    pub(super) fn label(&self, instances: usize) -> String {
        let label = match &self.kind {
            Kind::InARow { copies, .. } => format!("{copies} copies in a row"),
            Kind::AtOnce { copies, .. } => format!("{copies} concurrent copies"),
            Kind::NewerFirst { .. } => "the newer event, then the older one".to_owned(),
            Kind::HangUp { after, .. } if after.is_zero() => {
                "a sender that hung up once the app was at work, then sent again".to_owned()
            }
            Kind::HangUp { after, .. } => {
                format!("a sender that hung up {after:?} into the app's work, then sent again")
            }
        };
        if instances > 1 {
            format!("{label} across {instances} instances")
        } else {
            label
        }
    }
}

impl fmt::Debug for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let label = self.label(1);
        match &self.kind {
            Kind::InARow { delivery, .. }
            | Kind::AtOnce { delivery, .. }
            | Kind::HangUp { delivery, .. } => write!(f, "Scenario({label} of {delivery})"),
            Kind::NewerFirst { older, newer, .. } => {
                write!(f, "Scenario({label}: {newer}, then {older})")
            }
        }
    }
}

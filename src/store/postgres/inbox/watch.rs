//! The inbox's watch: `LISTEN` on a connection of its own, a wake for every notification.

use std::convert::Infallible;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use crate::store::inbox::Wake;

/// The pause after the first failure to listen; it doubles after each further one.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two attempts to listen.
const LAST_PAUSE: Duration = Duration::from_secs(5);

/// Listens on `channel` until dropped, waking `wake` for every notification and once after
/// every (re)start of the listening; made again after a failure, after a pause.
pub(super) async fn watch(options: PgConnectOptions, channel: String, wake: Wake) {
    let mut pause = FIRST_PAUSE;
    loop {
        let Err(error) = listen(&options, &channel, &wake, &mut pause).await;
        tracing::warn!(
            error = &error as &dyn std::error::Error,
            channel = %channel,
            retry_in = ?pause,
            "the inbox's notifications are not heard; listening again after a pause"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LAST_PAUSE);
    }
}

/// Listens until a failure. The listener's pool of one connection, outside the store's pool,
/// is where sqlx makes the connection again after losing it.
async fn listen(
    options: &PgConnectOptions,
    channel: &str,
    wake: &Wake,
    pause: &mut Duration,
) -> Result<Infallible, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(channel).await?;
    *pause = FIRST_PAUSE;
    wake.notify_waiters();
    loop {
        // `None`: the connection was lost, and made again (listening again) before this
        // answered; what was stored meanwhile is looked for.
        let _notification = listener.try_recv().await?;
        wake.notify_waiters();
    }
}

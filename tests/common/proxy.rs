//! A loopback TCP proxy that a test can cut, to fail a database connection while the shared
//! server keeps running.
//!
//! ```ignore
//! let proxy = Proxy::start(upstream).await;   // listens on 127.0.0.1:<random>
//! proxy.cut();      // closes every live connection and refuses new ones
//! proxy.stall();    // a black hole: connections stay open, nothing goes through
//! proxy.restore();  // accepts and pipes again (stalled connections are closed)
//! ```

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy from `127.0.0.1:<port>` to one upstream address.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accepted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Starts piping connections to `upstream`; it is up from the start.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let (state, watch) = watch::channel(State::Up);
        let accepted = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (a, r) = (accepted.clone(), refused.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let now = *watch.borrow();
                match now {
                    State::Up => {
                        a.fetch_add(1, Ordering::SeqCst);
                        tokio::spawn(pipe(client, upstream, watch.clone()));
                    }
                    // Refused: the client sees its connection closed at once.
                    State::Cut => {
                        r.fetch_add(1, Ordering::SeqCst);
                        drop(client);
                    }
                    // Accepted, and never answered while the stall lasts.
                    State::Stalled => {
                        let mut watch = watch.clone();
                        tokio::spawn(async move {
                            let _ = watch.wait_for(|s| *s != State::Stalled).await;
                            drop(client);
                        });
                    }
                }
            }
        });
        Self {
            addr,
            state,
            accepted,
            refused,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every live connection and refuses new ones until [`restore`](Self::restore).
    pub fn cut(&self) {
        self.state.send_replace(State::Cut);
    }

    /// Stops forwarding without closing anything, like a network partition that drops
    /// packets: live connections hang, new ones are accepted and never answered.
    pub fn stall(&self) {
        self.state.send_replace(State::Stalled);
    }

    /// Accepts and pipes connections again; connections that were stalled are closed.
    pub fn restore(&self) {
        self.state.send_replace(State::Up);
    }

    /// Connections piped so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections refused while cut.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.send_replace(State::Cut);
        self.task.abort();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Up,
    Cut,
    Stalled,
}

async fn pipe(mut client: TcpStream, upstream: SocketAddr, mut state: watch::Receiver<State>) {
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = state.wait_for(|s| *s != State::Up) => {}
    }
    let now = *state.borrow();
    if now == State::Stalled {
        let _ = state.wait_for(|s| *s != State::Stalled).await;
    }
    // Both sockets close here: to the client the database is gone mid-conversation.
}

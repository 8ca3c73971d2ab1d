//! The store's connection, to one server or to a cluster: a script run on it, a write that
//! waits for replicas (on one server on connections of the store's own, on a cluster routed to
//! the master of the key's slot), and the two answers the scripts give: a settlement, and a
//! heartbeat under a lease.

use std::sync::atomic::Ordering;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, Value};

use super::scripts::Scripted;
use super::{Conn, RedisStore, WAITING_CONNECTIONS, arg, lease_held, unreplicated};
use crate::store::{LeaseToken, StoreError};

impl RedisStore {
    /// Runs `script` on `key`: a read, or a write nobody waits on replicas for.
    pub(super) async fn call<T: FromRedisValue>(
        &self,
        script: &Scripted,
        key: &str,
        args: &[Vec<u8>],
    ) -> Result<T, StoreError> {
        let mut call = script.script().key(key);
        for arg in args {
            call.arg(arg.as_slice());
        }
        call.invoke_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::backend)
    }

    /// Runs the write `script` on `key`, and answers whether the replicas the store waits
    /// for have it (always, when it waits for none).
    pub(super) async fn write<T: FromRedisValue>(
        &self,
        script: &Scripted,
        key: &str,
        args: &[Vec<u8>],
    ) -> Result<(T, bool), StoreError> {
        let Some((replicas, timeout)) = self.replicas else {
            return Ok((self.call(script, key, args).await?, true));
        };
        let millis = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut write = redis::cmd("EVAL");
        write.arg(script.code).arg(1).arg(key);
        for arg in args {
            write.arg(arg.as_slice());
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(millis);
        let replies: Vec<Value> = match (&self.conn, self.waiting_connection().await?) {
            // One server: the write and its WAIT together, on a connection of the store's own.
            (_, Some(mut conn)) => {
                redis::pipe()
                    .add_command(write)
                    .add_command(wait)
                    .query_async(&mut conn)
                    .await
            }
            // A cluster: the write by its key, then the WAIT on the shared connection to the
            // master of the key's slot, which took the write (a second cluster client's WAIT
            // found no replica in a cluster formed moments before).
            (Conn::Cluster(conn), None) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let mut conn = conn.clone();
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot_of(key.as_bytes()), SlotAddr::Master),
                ));
                match write.query_async::<Value>(&mut conn).await {
                    Ok(value) => conn
                        .route_command(wait, route)
                        .await
                        .map(|acked| vec![value, acked]),
                    Err(error) => Err(error),
                }
            }
            // A store made on a connection: the shared one.
            (Conn::Single(conn), None) => {
                redis::pipe()
                    .add_command(write)
                    .add_command(wait)
                    .query_async(&mut conn.clone())
                    .await
            }
        }
        .map_err(StoreError::backend)?;
        let mut replies = replies.into_iter();
        let (Some(value), Some(acked)) = (replies.next(), replies.next()) else {
            return Err(StoreError::backend(
                "Redis answered the write and its WAIT with less than two replies",
            ));
        };
        let value = redis::from_redis_value(value).map_err(StoreError::backend)?;
        let acked: usize = redis::from_redis_value(acked).map_err(StoreError::backend)?;
        if acked < replicas {
            tracing::warn!(
                key,
                acked,
                replicas,
                ?timeout,
                "a write reached fewer replicas than the store waits for"
            );
        }
        Ok((value, acked >= replicas))
    }

    /// Runs the write `script` on `key`, whose answer 1 says that it settled something:
    /// whether it did. A settlement the replicas the store waits for did not confirm is an
    /// error; sent again, the script finds it done and waits again.
    pub(super) async fn settle(
        &self,
        script: &Scripted,
        key: &str,
        args: &[Vec<u8>],
    ) -> Result<bool, StoreError> {
        let (settled, replicated): (i64, bool) = self.write(script, key, args).await?;
        if settled == 1 && !replicated {
            return Err(unreplicated());
        }
        Ok(settled == 1)
    }

    /// Runs the heartbeat `script` on `key` for the lease's `token`: [`StoreError::LeaseLost`]
    /// unless it answers 1. A heartbeat does not wait for replicas: a lost one only makes a
    /// live lease look idle a little sooner after a failover.
    pub(super) async fn heartbeat(
        &self,
        script: &Scripted,
        key: &str,
        token: LeaseToken,
    ) -> Result<(), StoreError> {
        let held: i64 = self.call(script, key, &[arg(token.to_i64())]).await?;
        lease_held(held == 1)
    }

    /// On one server it connected to itself, a connection of the store's own for a write
    /// that waits for replicas, in turn; `None` otherwise.
    async fn waiting_connection(&self) -> Result<Option<ConnectionManager>, StoreError> {
        let Some(waiting) = &self.waiting else {
            return Ok(None);
        };
        let pool = waiting
            .conns
            .get_or_try_init(|| async {
                let mut pool = Vec::with_capacity(WAITING_CONNECTIONS);
                for _ in 0..WAITING_CONNECTIONS {
                    pool.push(ConnectionManager::new(waiting.client.clone()).await?);
                }
                Ok::<_, redis::RedisError>(pool)
            })
            .await
            .map_err(StoreError::backend)?;
        let turn = waiting.turn.fetch_add(1, Ordering::Relaxed) % pool.len();
        Ok(Some(pool[turn].clone()))
    }
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key, modulo
/// 16384, as Redis Cluster computes it.
fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in tagged {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_redis_cluster_computes() {
        // `CLUSTER KEYSLOT` of each, on Redis 7.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"123456789"), 0x31C3, "the CRC16 check value");
        assert_eq!(
            slot_of(b"{}foo"),
            slot_of(b"{}foo"),
            "an empty tag hashes the whole key"
        );
    }
}

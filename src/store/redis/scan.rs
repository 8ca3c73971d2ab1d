//! The maintenance calls that walk every key of the store: `SCAN` on the server, or on each
//! master of a cluster, then a read of each key found.

use std::time::Duration;

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Pipeline, Value};

use super::claims::micros;
use super::scripts::PURGE;
use super::{Conn, RedisStore};
use crate::key::IdempotencyKey;
use crate::store::{StoreError, StuckClaim};

/// Keys asked of `SCAN` per call.
const SCAN_COUNT: usize = 1000;

/// Where a `SCAN` runs: the one server, or a master of the cluster.
enum Node {
    Server,
    Master { host: String, port: u16 },
}

impl RedisStore {
    /// The nodes that hold the store's keys.
    async fn nodes(&self) -> Result<Vec<Node>, StoreError> {
        let Conn::Cluster(conn) = &self.conn else {
            return Ok(vec![Node::Server]);
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let text: String = parsed(conn.clone().route_command(cmd, route).await)?;
        Ok(masters(&text))
    }

    /// One `SCAN` call on `node`: the next cursor, and the store's claim keys it found.
    async fn scan_once(&self, node: &Node, cursor: u64) -> Result<(u64, Vec<String>), StoreError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(format!("{}:k:*", self.prefix))
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let value: redis::RedisResult<Value> = match (node, &self.conn) {
            (Node::Master { host, port }, Conn::Cluster(conn)) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                conn.clone().route_command(scan, route).await
            }
            _ => scan.query_async(&mut self.conn.clone()).await,
        };
        parsed(value)
    }

    /// Runs `pipeline` on `node` (where the keys it reads live).
    async fn on_node(
        &self,
        node: &Node,
        pipeline: Pipeline,
        count: usize,
    ) -> Result<Vec<Value>, StoreError> {
        match (node, &self.conn) {
            (Node::Master { host, port }, Conn::Cluster(conn)) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                conn.clone().route_pipeline(pipeline, 0, count, route).await
            }
            _ => pipeline.query_async(&mut self.conn.clone()).await,
        }
        .map_err(StoreError::backend)
    }

    /// The server's clock, in microseconds.
    async fn server_now(&self) -> Result<i64, StoreError> {
        let (seconds, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(StoreError::backend)?;
        Ok(seconds * 1_000_000 + micros)
    }

    /// A walk over every claim key of the store, node by node, reading `fields` of each.
    async fn walk(&self, fields: &'static [&'static str]) -> Result<Walk<'_>, StoreError> {
        Ok(Walk {
            store: self,
            nodes: self.nodes().await?,
            at: 0,
            cursor: 0,
            fields,
        })
    }

    pub(super) async fn stuck(&self, older_than: Duration) -> Result<Vec<StuckClaim>, StoreError> {
        let now = self.server_now().await?;
        let limit = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let mut stuck = Vec::new();
        const FIELDS: &[&str] = &[
            "state",
            "renewed_at",
            "claimed_at",
            "deliveries",
            "ns",
            "key",
        ];
        let mut walk = self.walk(FIELDS).await?;
        while let Some(rows) = walk.next().await? {
            for (redis_key, row) in rows {
                let text = |i: usize| {
                    row.get(i)
                        .and_then(|v| redis::from_redis_value::<Option<String>>(v.clone()).ok())
                        .flatten()
                };
                let number = |i: usize| text(i).and_then(|t| t.parse::<i64>().ok()).unwrap_or(0);
                if text(0).as_deref() != Some("processing") {
                    continue;
                }
                let idle = now - number(1);
                if idle < limit {
                    continue;
                }
                let (Some(ns), Some(value)) = (text(4), text(5)) else {
                    tracing::error!(key = redis_key, "a claim in Redis names no key; left out");
                    continue;
                };
                match IdempotencyKey::new(ns.clone(), value.clone()) {
                    Ok(key) => stuck.push(StuckClaim::new(
                        key,
                        micros(now - number(2)),
                        micros(idle),
                        u64::try_from(number(3)).unwrap_or(0),
                    )),
                    Err(error) => tracing::error!(
                        key = redis_key,
                        namespace = ns,
                        value,
                        %error,
                        "a claim in Redis is no valid key; left out"
                    ),
                }
            }
        }
        stuck.sort_by(|a, b| {
            b.since_renewal
                .cmp(&a.since_renewal)
                .then_with(|| a.key.namespace().cmp(b.key.namespace()))
                .then_with(|| a.key.value().cmp(b.key.value()))
        });
        Ok(stuck)
    }

    pub(super) async fn purge(&self, older_than: Duration) -> Result<u64, StoreError> {
        let now = self.server_now().await?;
        let before = now.saturating_sub(i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX));
        let mut purged = 0;
        let mut walk = self.walk(&["state", "completed_at"]).await?;
        while let Some(rows) = walk.next().await? {
            for (redis_key, row) in rows {
                let text = |i: usize| {
                    row.get(i)
                        .and_then(|v| redis::from_redis_value::<Option<String>>(v.clone()).ok())
                        .flatten()
                };
                let settled = matches!(text(0).as_deref(), Some("done" | "released"));
                let at = text(1).and_then(|t| t.parse::<i64>().ok());
                if !settled || at.is_none_or(|at| at > before) {
                    continue;
                }
                // Checked again in the script: the key may have been claimed since.
                let deleted: u64 = PURGE
                    .key(&redis_key)
                    .arg(before)
                    .invoke_async(&mut self.conn.clone())
                    .await
                    .map_err(StoreError::backend)?;
                purged += deleted;
            }
        }
        Ok(purged)
    }
}

/// Where a walk over the store's keys is.
struct Walk<'s> {
    store: &'s RedisStore,
    nodes: Vec<Node>,
    /// The node being scanned, and its cursor.
    at: usize,
    cursor: u64,
    fields: &'static [&'static str],
}

impl Walk<'_> {
    /// The next batch of claim keys with their fields; `None` once every node was walked.
    async fn next(&mut self) -> Result<Option<Vec<(String, Vec<Value>)>>, StoreError> {
        while let Some(node) = self.nodes.get(self.at) {
            let (next, keys) = self.store.scan_once(node, self.cursor).await?;
            if next == 0 {
                self.at += 1;
            }
            self.cursor = next;
            if keys.is_empty() {
                continue;
            }
            let mut pipeline = redis::pipe();
            for key in &keys {
                pipeline.cmd("HMGET").arg(key).arg(self.fields);
            }
            let rows = self.store.on_node(node, pipeline, keys.len()).await?;
            let rows = rows
                .into_iter()
                .map(|row| redis::from_redis_value::<Vec<Value>>(row).unwrap_or_default());
            return Ok(Some(keys.into_iter().zip(rows).collect()));
        }
        Ok(None)
    }
}

/// A reply read as `T`.
pub(super) fn parsed<T: redis::FromRedisValue>(
    reply: redis::RedisResult<Value>,
) -> Result<T, StoreError> {
    redis::from_redis_value(reply.map_err(StoreError::backend)?).map_err(StoreError::backend)
}

/// The masters listed by `CLUSTER NODES`, by address.
fn masters(nodes: &str) -> Vec<Node> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (_id, address, flags) = (fields.next()?, fields.next()?, fields.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let address = address.split(['@', ',']).next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some(Node::Master {
                host: host.to_owned(),
                port: port.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let nodes = "\
07c3 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
67ed 127.0.0.1:7004@17004 slave 07c3 0 1 4 connected
2924 127.0.0.1:7002@17002,node-b master - 0 1 2 connected 5461-10922
824f 127.0.0.1:7003@17003 master,fail - 0 1 3 disconnected
";
        let found: Vec<(String, u16)> = masters(nodes)
            .into_iter()
            .map(|node| match node {
                Node::Master { host, port } => (host, port),
                Node::Server => unreachable!(),
            })
            .collect();
        assert_eq!(
            found,
            [
                ("127.0.0.1".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7002)
            ]
        );
    }
}

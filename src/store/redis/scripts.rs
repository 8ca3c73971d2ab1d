//! The server-side scripts of the Redis store. Each touches one key (a claim's hash, or an
//! entity's), so each runs in one slot of a Redis Cluster, and takes its time from the
//! server (`TIME`), never from the application.
//!
//! A claim's hash holds `state` (`processing`, `done`, `released`), `token`, `deliveries`,
//! `runs`, `reclaimed` (0 or 1), the times `first_seen`, `last_seen`, `claimed_at`,
//! `renewed_at` and `completed_at` (microseconds of the server's clock), `receipt` when one
//! was kept, `resolved_by` once a person resolved it (see [`RESOLVE`]), and `ns` and `key`,
//! so that a scan can name the claim it finds.
//!
//! A client may run a script twice: redis-rs sends a command again when the connection it
//! went out on drops before the answer comes, and the first may have run. So every write
//! recognises its own second run by the token it was given and answers as the first did.

use std::sync::OnceLock;

use redis::Script;

/// A server script: its source, and the client's handle on it (which sends its digest, and
/// the source when the server does not know it yet).
pub(super) struct Scripted {
    pub(super) code: &'static str,
    script: OnceLock<Script>,
}

impl Scripted {
    const fn new(code: &'static str) -> Self {
        Self {
            code,
            script: OnceLock::new(),
        }
    }

    pub(super) fn script(&self) -> &Script {
        self.script.get_or_init(|| Script::new(self.code))
    }
}

/// The server's clock in microseconds, as every script starts.
macro_rules! now {
    () => {
        "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    };
}

/// A claim. `ARGV`: token (fresh for each claim), whether the policy reclaims (`1`), the
/// stale limit in microseconds, namespace, key. Answers `{kind, token, deliveries, age, idle,
/// reclaimed, receipt}`, `kind` one of `acquired`, `done`, `pending`. Only a claim that
/// acquires writes: a duplicate (`done`, `pending`) reads the hash and leaves it as it was,
/// its delivery counted by the store in the process (see [`TALLY`]).
///
/// A claim in flight under the caller's own token is the same claim sent again (a client
/// re-sends a script whose connection dropped before the answer came): it answers `acquired`
/// again, with the hash's deliveries and reclaimed flag, and writes nothing, so the delivery
/// and the run are counted once.
pub(super) static CLAIM: Scripted = Scripted::new(concat!(
    // A duplicate of a done key is the common read: one look at the hash, no clock needed.
    r#"
local h = KEYS[1]
local row = redis.call('HMGET', h, 'state', 'deliveries', 'receipt', 'claimed_at', 'renewed_at',
  'token', 'reclaimed')
local state = row[1]
if state == 'done' then
  return {'done', '', tonumber(row[2]), 0, 0, 0, row[3]}
end
if state == 'processing' and row[6] == ARGV[1] then
  return {'acquired', ARGV[1], tonumber(row[2]), 0, 0, tonumber(row[7]) or 0, false}
end
"#,
    now!(),
    r#"
if not state then
  redis.call('HSET', h, 'state', 'processing', 'token', ARGV[1], 'deliveries', 1, 'runs', 1,
    'reclaimed', 0, 'first_seen', now, 'last_seen', now, 'claimed_at', now, 'renewed_at', now,
    'ns', ARGV[4], 'key', ARGV[5])
  return {'acquired', ARGV[1], 1, 0, 0, 0, false}
end
local function take(reclaimed)
  local deliveries = redis.call('HINCRBY', h, 'deliveries', 1)
  redis.call('HSET', h, 'state', 'processing', 'token', ARGV[1], 'claimed_at', now,
    'renewed_at', now, 'reclaimed', reclaimed, 'last_seen', now)
  redis.call('HINCRBY', h, 'runs', 1)
  redis.call('HDEL', h, 'completed_at', 'receipt')
  redis.call('PERSIST', h)
  return {'acquired', ARGV[1], deliveries, 0, 0, reclaimed, false}
end
if state == 'released' then
  return take(0)
end
local idle = now - tonumber(row[5])
if idle < 0 then idle = 0 end
if ARGV[2] == '1' and idle >= tonumber(ARGV[3]) then
  return take(1)
end
local age = now - tonumber(row[4])
if age < 0 then age = 0 end
return {'pending', '', tonumber(row[2]), age, idle, 0, false}
"#
));

/// Adds deliveries counted in the process (duplicates, answered without a write) to a claim's
/// hash, if it still exists: `ARGV` the count and how long ago the last of them arrived, in
/// microseconds. Answers 1 if the key was there. The hash keeps its time to live.
pub(super) static TALLY: Scripted = Scripted::new(concat!(
    now!(),
    r#"
local h = KEYS[1]
local last = redis.call('HGET', h, 'last_seen')
if not last then return 0 end
redis.call('HINCRBY', h, 'deliveries', ARGV[1])
local seen = now - tonumber(ARGV[2])
if seen > tonumber(last) then redis.call('HSET', h, 'last_seen', seen) end
return 1
"#
));

/// A renewal. `ARGV`: token. Answers 1 if the lease held.
pub(super) static RENEW: Scripted = Scripted::new(concat!(
    now!(),
    r#"
local h = KEYS[1]
local row = redis.call('HMGET', h, 'state', 'token')
if row[1] ~= 'processing' or row[2] ~= ARGV[1] then return 0 end
redis.call('HSET', h, 'renewed_at', now)
return 1
"#
));

/// The script that settles a processing claim under its lease as `$state`, then runs `$then`
/// (Lua, once the state is written) and keeps the hash for the retention. `ARGV`: token,
/// retention in milliseconds, then what `$then` reads. Answers 1 if the lease held, and for a
/// second settlement of the same kind by the same lease (which changes nothing more); 0
/// otherwise.
macro_rules! settle {
    ($state:literal, $then:literal) => {
        concat!(
            now!(),
            "local settled = '",
            $state,
            "'\n",
            r#"
local h = KEYS[1]
local row = redis.call('HMGET', h, 'state', 'token')
if row[2] ~= ARGV[1] then return 0 end
if row[1] == settled then return 1 end
if row[1] ~= 'processing' then return 0 end
redis.call('HSET', h, 'state', settled, 'completed_at', now)
"#,
            $then,
            r#"
redis.call('PEXPIRE', h, ARGV[2])
return 1
"#
        )
    };
}

/// A commit: the claim settled `done`. `ARGV`: token, retention in milliseconds, whether a
/// receipt follows (`1`), the receipt.
pub(super) static COMMIT: Scripted = Scripted::new(settle!(
    "done",
    "if ARGV[3] == '1' then redis.call('HSET', h, 'receipt', ARGV[4]) end"
));

/// A release: the claim settled `released`. `ARGV`: token, retention in milliseconds.
pub(super) static RELEASE: Scripted = Scripted::new(settle!("released", ""));

/// Gives back a claim whose handler never started: a [`RELEASE`] that also takes back the run
/// the claim counted. `ARGV`: token, retention in milliseconds. A second give-back with the
/// same lease takes back nothing more: `runs` drops by one on the step from `processing` to
/// `released` alone, and never below 0.
pub(super) static GIVE_BACK: Scripted = Scripted::new(settle!(
    "released",
    r#"
local runs = tonumber(redis.call('HGET', h, 'runs')) or 0
if runs > 0 then redis.call('HINCRBY', h, 'runs', -1) end"#
));

/// A person settles a processing claim. `ARGV`: `done` or `release`, a fresh token,
/// retention in milliseconds. Answers 1 if there was such a claim.
///
/// The fresh token is kept as `resolved_by`: the same resolve sent again (a client re-sends a
/// script whose connection dropped before the answer came) finds it and answers 1 again,
/// changing nothing, even if a new claim took the key since. A done claim also takes the
/// token as its own, which fences off the old owner's late commit; a released one keeps its
/// owner's, whose release then still succeeds, as in the other stores.
pub(super) static RESOLVE: Scripted = Scripted::new(concat!(
    now!(),
    r#"
local h = KEYS[1]
local row = redis.call('HMGET', h, 'state', 'resolved_by')
if row[2] == ARGV[2] then return 1 end
if row[1] ~= 'processing' then return 0 end
if ARGV[1] == 'done' then
  redis.call('HSET', h, 'state', 'done', 'token', ARGV[2], 'completed_at', now)
else
  redis.call('HSET', h, 'state', 'released', 'completed_at', now)
end
redis.call('HSET', h, 'resolved_by', ARGV[2])
redis.call('PEXPIRE', h, ARGV[3])
return 1
"#
));

/// What a claim's hash holds, with the server's clock first: `{now, state, deliveries, runs,
/// reclaimed, first_seen, last_seen, claimed_at, renewed_at, completed_at, receipt}`, or
/// `{now}` for a key the store does not know.
pub(super) static DESCRIBE: Scripted = Scripted::new(concat!(
    now!(),
    r#"
local row = redis.call('HMGET', KEYS[1], 'state', 'deliveries', 'runs', 'reclaimed',
  'first_seen', 'last_seen', 'claimed_at', 'renewed_at', 'completed_at', 'receipt')
if not row[1] then return {now} end
table.insert(row, 1, now)
return row
"#
));

/// Deletes a settled claim if it was settled before `ARGV[1]` (microseconds of the server's
/// clock). Answers 1 if it deleted it.
pub(super) static PURGE: Scripted = Scripted::new(
    r#"
local row = redis.call('HMGET', KEYS[1], 'state', 'completed_at')
if row[1] ~= 'done' and row[1] ~= 'released' then return 0 end
if not row[2] or tonumber(row[2]) > tonumber(ARGV[1]) then return 0 end
return redis.call('DEL', KEYS[1])
"#,
);

/// Compares two decimal `i64` strings exactly (Lua's numbers are doubles, which lose
/// versions past 2^53): `-1`, `0` or `1`.
macro_rules! compare {
    () => {
        r#"
local function compare(a, b)
  local na, nb = a:sub(1, 1) == '-', b:sub(1, 1) == '-'
  if na ~= nb then return na and -1 or 1 end
  local x, y = a, b
  if na then x, y = b:sub(2), a:sub(2) end
  if #x ~= #y then return #x < #y and -1 or 1 end
  if x == y then return 0 end
  return x < y and -1 or 1
end
local function greater(a, b)
  if not a then return b end
  if compare(a, b) >= 0 then return a end
  return b
end
"#
    };
}

/// An entity's version hash holds `applied` (the latest version applied), while a version
/// is being applied `p_version`, `p_token` and `p_since` (its last heartbeat, microseconds of
/// the server's clock), and once one was settled `s_token`, the last settlement's own token
/// (see [`SETTLE_VERSION`]). A hash with no version applied has a time to live
/// (the store's retention) from a discard until the next version begins.
///
/// Begins a version. `ARGV`: version, token, whether the policy reclaims (`1`), the stale
/// limit in microseconds. Answers `{applied, pending version, pending token, idle}` after the
/// step (absent fields `nil`); the claim is ours if the pending token is the one passed.
pub(super) static BEGIN_VERSION: Scripted = Scripted::new(concat!(
    now!(),
    compare!(),
    r#"
local h = KEYS[1]
local row = redis.call('HMGET', h, 'applied', 'p_version', 'p_token', 'p_since')
local applied, version = row[1], ARGV[1]
local not_older = (not applied) or compare(applied, version) <= 0
local idle = 0
if row[2] then
  idle = now - tonumber(row[4])
  if idle < 0 then idle = 0 end
end
local free = (not row[2])
  or (ARGV[3] == '1' and idle >= tonumber(ARGV[4]) and compare(row[2], version) <= 0)
if not_older and free then
  redis.call('HSET', h, 'p_version', version, 'p_token', ARGV[2], 'p_since', now)
  redis.call('PERSIST', h)
  return {applied, version, ARGV[2], 0}
end
return {applied, row[2], row[3], idle}
"#
));

/// Renews a pending version. `ARGV`: token. Answers 1 if the lease held.
pub(super) static RENEW_VERSION: Scripted = Scripted::new(concat!(
    now!(),
    r#"
if redis.call('HGET', KEYS[1], 'p_token') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'p_since', now)
return 1
"#
));

/// Settles a pending version. `ARGV`: token (or `""` for whoever holds it, a person
/// resolving), `apply` or `discard`, a fresh token for this settlement, retention in
/// milliseconds. Answers 1 if there was such a pending version.
///
/// A settlement keeps its fresh token as `s_token`. The same settlement sent again (a client
/// re-sends a script whose connection dropped before the answer came) finds it and answers 1
/// again, changing nothing, even if another version began since; a second settlement by the
/// same lease, with a fresh token of its own, finds no pending version and answers 0. A
/// discard where no version was ever applied keeps the hash with only `s_token` (deleted, it
/// would leave nothing to recognise), to expire after the retention unless a version begins
/// first.
pub(super) static SETTLE_VERSION: Scripted = Scripted::new(concat!(
    compare!(),
    r#"
local h = KEYS[1]
local row = redis.call('HMGET', h, 'applied', 'p_version', 'p_token', 's_token')
if row[4] == ARGV[3] then return 1 end
if not row[2] then return 0 end
if ARGV[1] ~= '' and row[3] ~= ARGV[1] then return 0 end
redis.call('HDEL', h, 'p_version', 'p_token', 'p_since')
redis.call('HSET', h, 's_token', ARGV[3])
if ARGV[2] == 'apply' then
  redis.call('HSET', h, 'applied', greater(row[1], row[2]))
elseif not row[1] then
  redis.call('PEXPIRE', h, ARGV[4])
end
return 1
"#
));

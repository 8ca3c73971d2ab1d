//! What the store asks the server: which it is (MySQL, or MariaDB of which release), whether
//! its SQL mode is safe for claims, and what its error numbers mean.

use super::MySqlFlavor;
use crate::store::StoreError;

/// Whether the server answering `SELECT VERSION()` with `version` is MariaDB (`10.11.6-MariaDB`,
/// `11.4.2-MariaDB-log`, `5.5.5-10.4.12-MariaDB-1:10.4.12+maria~bionic`) rather than MySQL.
pub(super) fn is_mariadb(version: &str) -> bool {
    version.to_ascii_lowercase().contains("mariadb")
}

/// The release of a MariaDB server, `(major, minor)`, from its `SELECT VERSION()`; MariaDB 10
/// may carry the `5.5.5-` prefix it shows older clients.
pub(super) fn mariadb_release(version: &str) -> Option<(u32, u32)> {
    let version = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut numbers = version.split(|c: char| !c.is_ascii_digit());
    let major = numbers.next()?.parse().ok()?;
    let minor = numbers.next()?.parse().ok()?;
    Some((major, minor))
}

/// How claims are made on the server answering `SELECT VERSION()` with `version`: with
/// `RETURNING` on MariaDB 10.5 and later, with two statements on MySQL and on older MariaDB
/// (whose `INSERT` has no `RETURNING`), and on a MariaDB whose release cannot be read.
pub(super) fn flavor_of(version: &str) -> MySqlFlavor {
    match mariadb_release(version) {
        Some(release) if is_mariadb(version) && release >= (10, 5) => MySqlFlavor::MariaDb,
        _ => MySqlFlavor::MySql,
    }
}

/// Refuses a server whose SQL mode, for this connection (`session`) or for new ones
/// (`global`), has MariaDB's `SIMULTANEOUS_ASSIGNMENT`: the claims rely on the assignments of
/// `ON DUPLICATE KEY UPDATE` running left to right, each seeing the ones before it, and under
/// that mode a claim would hand out leases without starting a run (a handler could run twice).
pub(super) fn check_sql_mode(session: &str, global: &str) -> Result<(), StoreError> {
    let simultaneous = |mode: &str| {
        mode.split(',')
            .any(|m| m.trim().eq_ignore_ascii_case("SIMULTANEOUS_ASSIGNMENT"))
    };
    let (on_session, on_global) = (simultaneous(session), simultaneous(global));
    if !on_session && !on_global {
        return Ok(());
    }
    let scope = match (on_session, on_global) {
        (true, true) => "the server's default (@@GLOBAL.sql_mode) and this connection's",
        (false, true) => "the server's default (@@GLOBAL.sql_mode)",
        _ => "this connection's (@@SESSION.sql_mode)",
    };
    let fix = if on_global {
        "remove it from sql_mode in the server's configuration and with \
         SET GLOBAL sql_mode = REPLACE(@@GLOBAL.sql_mode, 'SIMULTANEOUS_ASSIGNMENT', '')"
    } else {
        "remove it from what sets the session's sql_mode (the pool's after_connect, or the \
         connection options)"
    };
    Err(StoreError::backend(format!(
        "the SQL mode {scope} includes SIMULTANEOUS_ASSIGNMENT, under which the store's claims \
         are not safe (they rely on ON DUPLICATE KEY UPDATE assigning left to right): {fix}"
    )))
}

/// ER_DUP_ENTRY.
pub(super) const DUPLICATE_KEY: u16 = 1062;
/// ER_LOCK_WAIT_TIMEOUT.
pub(super) const LOCK_WAIT_TIMEOUT: u16 = 1205;
/// ER_LOCK_DEADLOCK.
pub(super) const DEADLOCK: u16 = 1213;

pub(super) fn mysql_error(e: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|e| e.number())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flavor_follows_the_server_and_its_release() {
        for (version, flavor) in [
            // MariaDB 10.5 and later: INSERT … RETURNING.
            ("10.11.19-MariaDB-0+deb12u1", MySqlFlavor::MariaDb),
            ("10.5.0-MariaDB", MySqlFlavor::MariaDb),
            ("10.6.12-MariaDB-log", MySqlFlavor::MariaDb),
            ("11.4.2-MariaDB-ubu2404", MySqlFlavor::MariaDb),
            ("12.0.1-MariaDB", MySqlFlavor::MariaDb),
            (
                "5.5.5-10.5.8-MariaDB-1:10.5.8+maria~focal",
                MySqlFlavor::MariaDb,
            ),
            // Older MariaDB has no RETURNING: two statements, as on MySQL.
            ("10.4.32-MariaDB", MySqlFlavor::MySql),
            ("10.3.39-MariaDB-0ubuntu0.20.04.2", MySqlFlavor::MySql),
            (
                "5.5.5-10.4.12-MariaDB-1:10.4.12+maria~bionic",
                MySqlFlavor::MySql,
            ),
            ("10.1.48-MariaDB", MySqlFlavor::MySql),
            ("5.5.68-MariaDB", MySqlFlavor::MySql),
            // A MariaDB whose release cannot be read: the path every server runs.
            ("MariaDB", MySqlFlavor::MySql),
            ("x.y-MariaDB", MySqlFlavor::MySql),
            // MySQL, whatever its release.
            ("8.0.36", MySqlFlavor::MySql),
            ("8.0.36-0ubuntu0.22.04.1", MySqlFlavor::MySql),
            ("8.4.0-commercial", MySqlFlavor::MySql),
            ("11.0.0", MySqlFlavor::MySql),
            ("", MySqlFlavor::MySql),
        ] {
            assert_eq!(flavor_of(version), flavor, "{version}");
        }
        assert!(is_mariadb("10.4.32-MariaDB") && is_mariadb("10.6.1-mariadb"));
        assert!(!is_mariadb("8.0.36"));
        assert_eq!(mariadb_release("10.11.19-MariaDB"), Some((10, 11)));
        assert_eq!(mariadb_release("5.5.5-10.4.12-MariaDB"), Some((10, 4)));
        assert_eq!(mariadb_release("11-MariaDB"), None);
    }

    #[test]
    fn simultaneous_assignment_is_refused() {
        let default = "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION";
        assert!(check_sql_mode(default, default).is_ok());
        assert!(check_sql_mode("", "").is_ok());
        let with = format!("{default},SIMULTANEOUS_ASSIGNMENT");
        for (session, global, says) in [
            (with.as_str(), default, "@@SESSION.sql_mode"),
            (default, with.as_str(), "SET GLOBAL sql_mode"),
            (with.as_str(), with.as_str(), "SET GLOBAL sql_mode"),
            ("simultaneous_assignment", "", "@@SESSION.sql_mode"),
        ] {
            let err = check_sql_mode(session, global).unwrap_err();
            let message = std::error::Error::source(&err).unwrap().to_string();
            assert!(message.contains("SIMULTANEOUS_ASSIGNMENT"), "{message}");
            assert!(message.contains(says), "{message}");
        }
    }
}

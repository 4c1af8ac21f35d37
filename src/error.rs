//! The daemon's typed errors. Each kind maps to one D-Bus error name
//! (`org.astraeus.Node1.Error.<Kind>`), so a caller can act on the kind and a
//! person on the message; nothing is collapsed into a generic failure.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The request is malformed; the message starts with the field path.
    InvalidRequest(String),
    NotFound(String),
    Exists(String),
    AccessDenied(String),
    /// The request is valid but the current state does not allow it.
    Conflict(String),
    /// The ledger, a GPU library or a runtime failed underneath us.
    Backend(String),
    /// The daemon is shutting down or its queue is full; try again.
    Busy(String),
    /// The caller already holds as many workers as its quota allows.
    QuotaExceeded(String),
    /// The request could never be placed on this machine, whatever leaves.
    Unsatisfiable(String),
}

impl Error {
    /// A field-level validation error: `path: what would be accepted`.
    pub fn field(path: &str, message: impl fmt::Display) -> Error {
        Error::InvalidRequest(format!("{path}: {message}"))
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidRequest(_) => "InvalidRequest",
            Error::NotFound(_) => "NotFound",
            Error::Exists(_) => "Exists",
            Error::AccessDenied(_) => "AccessDenied",
            Error::Conflict(_) => "Conflict",
            Error::Backend(_) => "Backend",
            Error::Busy(_) => "Busy",
            Error::QuotaExceeded(_) => "QuotaExceeded",
            Error::Unsatisfiable(_) => "Unsatisfiable",
        }
    }

    /// The error of kind `kind` (as [`Error::kind`] names it) with `message`;
    /// an unknown kind is a backend failure.
    pub fn from_kind(kind: &str, message: String) -> Error {
        match kind {
            "InvalidRequest" => Error::InvalidRequest(message),
            "NotFound" => Error::NotFound(message),
            "Exists" => Error::Exists(message),
            "AccessDenied" => Error::AccessDenied(message),
            "Conflict" => Error::Conflict(message),
            "Busy" => Error::Busy(message),
            "QuotaExceeded" => Error::QuotaExceeded(message),
            "Unsatisfiable" => Error::Unsatisfiable(message),
            _ => Error::Backend(message),
        }
    }

    /// The same error, its message made printable for a terminal, a log
    /// or a page: every character that hides or turns text around (bidi
    /// overrides such as U+202E, the line separators U+2028 and U+2029,
    /// control characters but line breaks and tabs) replaced by `?`. What
    /// a caller wrote may be quoted in a message (a schedule's text, a
    /// name): this is the one place every error passes on its way out.
    pub fn printable(self) -> Error {
        if !self.message().chars().any(crate::text::unseen) {
            return self;
        }
        let shown = crate::text::printable_lines(self.message());
        Error::from_kind(self.kind(), shown)
    }

    pub fn message(&self) -> &str {
        match self {
            Error::InvalidRequest(m)
            | Error::NotFound(m)
            | Error::Exists(m)
            | Error::AccessDenied(m)
            | Error::Conflict(m)
            | Error::Backend(m)
            | Error::Busy(m)
            | Error::QuotaExceeded(m)
            | Error::Unsatisfiable(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind(), self.message())
    }
}

impl std::error::Error for Error {}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        use rusqlite::ErrorCode::{DiskFull, ReadOnly, SystemIoFailure};
        let refused = "new work is refused until it can be written again; \
                       nothing acknowledged is lost";
        match e.sqlite_error_code() {
            Some(DiskFull) => Error::Backend(format!("ledger: its disk is full, so {refused}")),
            Some(ReadOnly) => Error::Backend(format!("ledger: it is read-only, so {refused}")),
            // A filesystem that failed goes read-only: writes get EIO.
            Some(SystemIoFailure) => {
                Error::Backend(format!("ledger: its storage failed ({e}), so {refused}"))
            }
            // The commit hook refuses every commit after a failed fsync (store).
            _ if matches!(&e, rusqlite::Error::SqliteFailure(f, _)
                if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_COMMITHOOK) =>
            {
                Error::Backend(
                    "ledger: its disk did not confirm earlier writes, so new work is refused \
                     until the daemon restarts"
                        .into(),
                )
            }
            _ => Error::Backend(format!("ledger: {e}")),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

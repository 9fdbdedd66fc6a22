//! What a failed storage operation says about the store behind the lake:
//! an object store that may answer the next try, one that refused us, or
//! a local disk that is full, read-only or closed to this user. Read from
//! the causes an error carries (opendal's for object stores, the standard
//! library's for local files), so every call site that kept its source
//! is classified alike.

use std::io::ErrorKind as IoKind;

use opendal::ErrorKind as StoreKind;

/// How the storage under the lake failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StorageFault {
    /// A timeout, a reset or refused connection, a 5xx, throttling: the
    /// store may answer the next try.
    Transient,
    /// The object store refused the credentials or the request (403).
    Denied,
    /// The object store has no such bucket or object (404, NoSuchBucket).
    Missing,
    /// The object store rejected the request as malformed (another 4xx).
    Rejected,
    /// The local disk is full (ENOSPC).
    DiskFull,
    /// The local file system is mounted read-only (EROFS).
    ReadOnly,
    /// The local file system refused this user (EACCES, EPERM).
    NoPermission,
}

impl StorageFault {
    /// The fault an error found in a cause chain reports, if it is one.
    pub(super) fn of(err: &(dyn std::error::Error + 'static)) -> Option<StorageFault> {
        if let Some(store) = err.downcast_ref::<opendal::Error>() {
            return StorageFault::of_store(store);
        }
        let kind = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io.kind(),
            // iceberg's local storage puts the I/O error in its message.
            None => os_error_kind(&err.to_string())?,
        };
        match kind {
            IoKind::StorageFull | IoKind::QuotaExceeded => Some(StorageFault::DiskFull),
            IoKind::ReadOnlyFilesystem => Some(StorageFault::ReadOnly),
            IoKind::PermissionDenied => Some(StorageFault::NoPermission),
            _ => None,
        }
    }

    /// opendal's kinds, and for its catch-all the HTTP status of the
    /// response, when there was one (opendal marks every error that went
    /// through its retries alike, so the mark tells nothing).
    fn of_store(err: &opendal::Error) -> Option<StorageFault> {
        match err.kind() {
            StoreKind::PermissionDenied => Some(StorageFault::Denied),
            StoreKind::NotFound | StoreKind::ConfigInvalid => Some(StorageFault::Missing),
            StoreKind::RateLimited => Some(StorageFault::Transient),
            StoreKind::Unexpected => match response_status(&err.to_string()) {
                Some(status)
                    if (400..500).contains(&status) && ![408, 429, 499].contains(&status) =>
                {
                    Some(StorageFault::Rejected)
                }
                _ => Some(StorageFault::Transient),
            },
            _ => None,
        }
    }

    /// Whether a later try may succeed without a person's help.
    pub(crate) fn is_transient(self) -> bool {
        self == StorageFault::Transient
    }

    /// What the fault is, and what a person can do about it.
    pub(crate) fn explanation(self) -> &'static str {
        match self {
            StorageFault::Transient => {
                "the object store did not answer in time or failed for the moment \
                 (a timeout, a reset connection, a 5xx or throttling); a running \
                 pipeline retries it for storage_retry_deadline"
            }
            StorageFault::Denied => {
                "the object store refused access (403): check the keys (s3.access-key-id, \
                 AWS_ACCESS_KEY_ID, the role), that they are not expired, and that the \
                 bucket's policy lets them read, write and delete under the warehouse"
            }
            StorageFault::Missing => {
                "the object store has no such bucket or object: check the warehouse's \
                 bucket name and region (s3.region), or whether a file of the lake was \
                 removed behind its back"
            }
            StorageFault::Rejected => {
                "the object store rejected the request (a 4xx other than 403 and 404): \
                 check s3.endpoint, s3.region and s3.path-style-access"
            }
            StorageFault::DiskFull => {
                "the disk holding the lake is full: free space there (or expire old \
                 snapshots) or move the warehouse, then start again; nothing was confirmed \
                 past what the lake holds"
            }
            StorageFault::ReadOnly => {
                "the file system holding the lake is mounted read-only: remount it \
                 read-write or point --lake at a writable folder"
            }
            StorageFault::NoPermission => {
                "this user may not write the lake's folder: give it ownership (chown) or \
                 write permission there, or run as the folder's owner"
            }
        }
    }
}

/// The kind of the OS error a message quotes as Rust prints one
/// (`No space left on device (os error 28)`).
fn os_error_kind(message: &str) -> Option<IoKind> {
    let code = message.split("(os error ").nth(1)?.split(')').next()?;
    Some(std::io::Error::from_raw_os_error(code.parse().ok()?).kind())
}

/// The HTTP status opendal recorded for a failed request, from the
/// response it keeps in its context (`response: Parts { status: 400, ...`).
fn response_status(display: &str) -> Option<u16> {
    let after = display.split("response: Parts { status: ").nth(1)?;
    after.get(..3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(kind: StoreKind, status: Option<u16>) -> Option<StorageFault> {
        let mut err = opendal::Error::new(kind, "failed");
        if let Some(status) = status {
            err = err.with_context(
                "response",
                format!("Parts {{ status: {status}, version: HTTP/1.1, headers: {{}} }}"),
            );
        }
        StorageFault::of(&err)
    }

    #[test]
    fn store_errors_are_transient_unless_the_store_answered_no() {
        use StorageFault::*;
        for (kind, status, fault) in [
            (StoreKind::Unexpected, None, Some(Transient)),
            (StoreKind::Unexpected, Some(503), Some(Transient)),
            (StoreKind::Unexpected, Some(408), Some(Transient)),
            (StoreKind::RateLimited, Some(429), Some(Transient)),
            (StoreKind::Unexpected, Some(400), Some(Rejected)),
            (StoreKind::PermissionDenied, Some(403), Some(Denied)),
            (StoreKind::ConfigInvalid, Some(404), Some(Missing)),
            (StoreKind::AlreadyExists, None, None),
        ] {
            assert_eq!(store(kind, status), fault, "{kind:?} {status:?}");
        }
    }

    #[test]
    fn local_errors_are_told_by_their_kind() {
        let of = |kind| StorageFault::of(&std::io::Error::from(kind));
        assert_eq!(of(IoKind::StorageFull), Some(StorageFault::DiskFull));
        assert_eq!(of(IoKind::ReadOnlyFilesystem), Some(StorageFault::ReadOnly));
        assert_eq!(
            of(IoKind::PermissionDenied),
            Some(StorageFault::NoPermission)
        );
        assert_eq!(of(IoKind::ConnectionReset), None);
        let quoted = |message: &str| StorageFault::of(&opendal_free(message));
        assert_eq!(
            quoted("Failed to write to file: No space left on device (os error 28)"),
            Some(StorageFault::DiskFull)
        );
        assert_eq!(
            quoted("Read-only file system (os error 30)"),
            Some(StorageFault::ReadOnly)
        );
        assert_eq!(quoted("failed (os error 104)"), None);
    }

    /// An error that only quotes its cause, as iceberg's local storage does.
    fn opendal_free(message: &str) -> iceberg::Error {
        iceberg::Error::new(iceberg::ErrorKind::Unexpected, message)
    }
}

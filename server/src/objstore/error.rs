//! What can go wrong with an object store, and what a request does about it. Every error
//! names the object's (or prefix's) URL and carries the store's own answer.

use crate::source::{SourceError, SourceErrorKind};

/// Why an object-store source could not be listed, opened or read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    /// The address is not one this build serves.
    #[error("object-store address '{url}' is refused: {why}")]
    Address {
        /// The address as written.
        url: String,
        /// Why.
        why: String,
    },
    /// The store's client could not be built from the configuration.
    #[error("object store for '{url}' cannot be set up: {why}")]
    Setup {
        /// The address.
        url: String,
        /// Why (never a secret: the client's message about a setting).
        why: String,
    },
    /// The store did not answer, or answered with a server error or throttling after the
    /// retries.
    #[error("object store {store} is unreachable ({url}): {answer}")]
    Unreachable {
        /// `s3://BUCKET` (`gs://BUCKET`, `az://CONTAINER`, `https://HOST`).
        store: String,
        /// What was asked for.
        url: String,
        /// What the client got.
        answer: String,
    },
    /// The store refused the credentials (403) or asked for them (401).
    #[error("object store denied access to {url}: {answer}")]
    Denied {
        /// What was asked for.
        url: String,
        /// The store's answer.
        answer: String,
    },
    /// The bucket or the object does not exist.
    #[error("object store has no {url}: {answer}")]
    Missing {
        /// What was asked for.
        url: String,
        /// The store's answer.
        answer: String,
    },
    /// The object was replaced since it was listed (its ETag no longer matches).
    #[error("object {url} changed since it was listed: {answer}")]
    Changed {
        /// The object.
        url: String,
        /// The store's answer.
        answer: String,
    },
    /// The object's content cannot be served (a truncated object, a bad header, a reply
    /// shorter or longer than asked).
    #[error("object {url} is refused: {why}")]
    Refused {
        /// The object.
        url: String,
        /// Why.
        why: String,
    },
    /// An OME-Zarr image whose metadata or datasets do not make one pyramid.
    #[error(transparent)]
    Image(#[from] crate::source::zarr::ZarrError),
    /// The store answered something else.
    #[error("object store failed to {what} {url}: {answer}")]
    Failed {
        /// The call.
        what: &'static str,
        /// What was asked for.
        url: String,
        /// The store's answer.
        answer: String,
    },
}

impl ObjectStoreError {
    /// The error of a call `what` on `url` of store `store` (`s3://BUCKET`, `gs://BUCKET`,
    /// `az://CONTAINER`) that got `err`.
    pub fn of_store(
        store: &str,
        what: &'static str,
        url: &str,
        err: object_store::Error,
    ) -> ObjectStoreError {
        let url = url.to_string();
        let answer = err.to_string();
        match err {
            object_store::Error::NotFound { .. } => ObjectStoreError::Missing { url, answer },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => {
                ObjectStoreError::Denied { url, answer }
            }
            object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
                ObjectStoreError::Changed { url, answer }
            }
            object_store::Error::Generic { source, .. } if is_unreachable(source.as_ref()) => {
                ObjectStoreError::Unreachable {
                    store: store.to_string(),
                    url,
                    answer,
                }
            }
            // A listing's refusals come as generic errors carrying the status.
            _ if answer.contains("status code: 403") || answer.contains("status code: 401") => {
                ObjectStoreError::Denied { url, answer }
            }
            _ if answer.contains("status code: 404") => ObjectStoreError::Missing { url, answer },
            _ => ObjectStoreError::Failed { what, url, answer },
        }
    }

    /// Whether the store could not be reached (as opposed to answering a refusal).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, ObjectStoreError::Unreachable { .. })
    }

    /// What a request does about it: an unreachable store is UNAVAILABLE naming it, a
    /// replaced object a stale chunk (plan again once the rescan has seen it).
    pub fn kind(&self) -> SourceErrorKind {
        match self {
            ObjectStoreError::Unreachable { .. } => SourceErrorKind::Unreachable,
            ObjectStoreError::Changed { .. } => SourceErrorKind::Changed,
            _ => SourceErrorKind::Failed,
        }
    }

    /// The error as the chunk service sees it, its message kept.
    pub fn to_source_error(&self) -> SourceError {
        SourceError::new(self.kind(), self.to_string())
    }
}

/// Whether a generic store error is the store not answering: a connection or transport
/// failure anywhere in its causes, or a server error or throttling it kept answering
/// through the retries.
fn is_unreachable(source: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(err) = cause {
        if err.is::<object_store::client::HttpError>() {
            return true;
        }
        let text = err.to_string();
        if text.contains("status code: 5") || text.contains("status code: 429") {
            return true;
        }
        cause = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_answer_decides_the_kind() {
        let of = |err| ObjectStoreError::of_store("s3://b", "read", "s3://b/k", err);
        let missing = of(object_store::Error::NotFound {
            path: "k".into(),
            source: "NoSuchBucket".into(),
        });
        assert_eq!(missing.kind(), SourceErrorKind::Failed);
        assert!(
            missing.to_string().contains("s3://b/k")
                && missing.to_string().contains("NoSuchBucket")
        );
        let denied = of(object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "AccessDenied".into(),
        });
        assert!(matches!(denied, ObjectStoreError::Denied { .. }));
        let changed = of(object_store::Error::Precondition {
            path: "k".into(),
            source: "412".into(),
        });
        assert_eq!(changed.kind(), SourceErrorKind::Changed);
        let throttled = of(object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 503 Service Unavailable".into(),
        });
        assert_eq!(throttled.kind(), SourceErrorKind::Unreachable);
        assert!(
            throttled
                .to_string()
                .contains("object store s3://b is unreachable")
        );
        let bad = of(object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 400 Bad Request".into(),
        });
        assert_eq!(bad.kind(), SourceErrorKind::Failed);
        let listing_denied = of(object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 403 Forbidden: InvalidAccessKeyId".into(),
        });
        assert!(matches!(listing_denied, ObjectStoreError::Denied { .. }));
    }
}

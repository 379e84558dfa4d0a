//! The typed refusals of the `.npy` reader.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Shows the source an error is about: its path, or `<memory>` for bytes the caller holds.
struct Origin<'a>(Option<&'a Path>);

impl fmt::Display for Origin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(path) => write!(f, "{}", path.display()),
            None => f.write_str("<memory>"),
        }
    }
}

fn origin(file: &Option<PathBuf>) -> Origin<'_> {
    Origin(file.as_deref())
}

/// Formats a shape the way numpy prints it: `(3,)`, `(2, 3)`, `()`.
pub(crate) fn fmt_shape(shape: &[u64]) -> String {
    match shape {
        [] => "()".to_owned(),
        [one] => format!("({one},)"),
        dims => {
            let parts: Vec<String> = dims.iter().map(u64::to_string).collect();
            format!("({})", parts.join(", "))
        }
    }
}

/// Why a `.npy` source, or a read from it, was refused.
///
/// Every variant names the source (`file` is `None` for bytes held by the caller, displayed
/// as `<memory>`) and what was refused.
#[derive(thiserror::Error, Debug)]
pub enum NpyError {
    /// An operating-system read or stat failed.
    #[error("{}: {action}: {source}", origin(file))]
    Io {
        /// The source.
        file: Option<PathBuf>,
        /// What was being done, e.g. "open", "read the payload".
        action: &'static str,
        /// The operating-system error.
        source: io::Error,
    },
    /// The path names something other than a regular file (a directory, a FIFO, a device).
    #[error(
        "{}: not a regular file ({kind}): only regular files are served",
        origin(file)
    )]
    NotAFile {
        /// The source.
        file: Option<PathBuf>,
        /// What the path names instead.
        kind: &'static str,
    },
    /// The source holds no bytes at all.
    #[error("{}: the file is empty: not a .npy file", origin(file))]
    EmptyFile {
        /// The source.
        file: Option<PathBuf>,
    },
    /// The source does not begin with the `\x93NUMPY` magic.
    #[error(
        "{}: not a .npy file: it begins with {found}, not the magic \\x93NUMPY",
        origin(file)
    )]
    BadMagic {
        /// The source.
        file: Option<PathBuf>,
        /// The first bytes found, escaped.
        found: String,
    },
    /// The format version is not 1.0, 2.0 or 3.0.
    #[error(
        "{}: unknown .npy version {major}.{minor} (1.0, 2.0 and 3.0 are read)",
        origin(file)
    )]
    UnsupportedVersion {
        /// The source.
        file: Option<PathBuf>,
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The declared header length exceeds the configured bound (checked before reading it).
    #[error(
        "{}: header length {len} exceeds the limit of {limit} bytes",
        origin(file)
    )]
    HeaderTooLong {
        /// The source.
        file: Option<PathBuf>,
        /// The declared header length.
        len: u64,
        /// The configured bound, [`Limits::max_header_len`](super::Limits::max_header_len).
        limit: usize,
    },
    /// The source ends inside the magic, version, length field or header.
    #[error(
        "{}: header truncated: {present} bytes present, {needed} needed",
        origin(file)
    )]
    TruncatedHeader {
        /// The source.
        file: Option<PathBuf>,
        /// How many bytes from the start are needed to go on.
        needed: u64,
        /// How many were available.
        present: u64,
    },
    /// Magic, version, length field and header do not add up to a multiple of 16 bytes.
    #[error(
        "{}: the header ends at byte {prefix_len}, which is not a multiple of 16 (numpy aligns it to 64)",
        origin(file)
    )]
    MisalignedHeader {
        /// The source.
        file: Option<PathBuf>,
        /// Magic + version + length field + header, in bytes.
        prefix_len: u64,
    },
    /// The header bytes are not in the encoding its version requires.
    #[error("{}: header encoding refused: {reason}", origin(file))]
    HeaderEncoding {
        /// The source.
        file: Option<PathBuf>,
        /// What was wrong, naming the offending byte.
        reason: String,
    },
    /// The dtype is `O` (object): the payload is a pickle, i.e. code. Refused before anything else.
    #[error(
        "{}: object dtype ('{descr}') is refused: its payload is a pickle",
        origin(file)
    )]
    ObjectDtype {
        /// The source.
        file: Option<PathBuf>,
        /// The dtype string as written.
        descr: String,
    },
    /// The dtype is structured (a list of fields).
    #[error(
        "{}: structured dtype {descr} is refused: only plain numeric dtypes are served",
        origin(file)
    )]
    StructuredDtype {
        /// The source.
        file: Option<PathBuf>,
        /// The list as written (shortened when long).
        descr: String,
    },
    /// The dtype is not one of `b1 i1 i2 i4 i8 u1 u2 u4 u8 f2 f4 f8 c8 c16` with a byte order.
    #[error("{}: dtype '{descr}' is not supported", origin(file))]
    UnsupportedDtype {
        /// The source.
        file: Option<PathBuf>,
        /// The dtype string as written.
        descr: String,
    },
    /// The header is not the plain dict literal of the format (it is never evaluated).
    #[error("{}: header refused: {reason}", origin(file))]
    HeaderSyntax {
        /// The source.
        file: Option<PathBuf>,
        /// What was expected and what the header held instead.
        reason: String,
    },
    /// The header holds a key other than `descr`, `fortran_order`, `shape`.
    #[error("{}: header key '{key}' is not allowed", origin(file))]
    UnknownKey {
        /// The source.
        file: Option<PathBuf>,
        /// The key as written.
        key: String,
    },
    /// A header key appears more than once.
    #[error("{}: header key '{key}' appears more than once", origin(file))]
    DuplicateKey {
        /// The source.
        file: Option<PathBuf>,
        /// The repeated key.
        key: String,
    },
    /// One of the three required keys is absent.
    #[error("{}: header key '{key}' is missing", origin(file))]
    MissingKey {
        /// The source.
        file: Option<PathBuf>,
        /// The missing key.
        key: &'static str,
    },
    /// A shape dimension is negative.
    #[error("{}: shape dimension {value} is negative", origin(file))]
    NegativeDimension {
        /// The source.
        file: Option<PathBuf>,
        /// The dimension as written.
        value: String,
    },
    /// A dimension, the element count or the byte size does not fit in u64.
    #[error("{}: byte size of shape {shape} overflows u64", origin(file))]
    SizeOverflow {
        /// The source.
        file: Option<PathBuf>,
        /// The shape as written.
        shape: String,
    },
    /// The shape is `()`: a 0-d scalar.
    #[error("{}: scalar shape () is not served", origin(file))]
    ScalarShape {
        /// The source.
        file: Option<PathBuf>,
    },
    /// The element count or byte size exceeds a configured bound.
    #[error(
        "{}: {what} {value} of shape {shape} exceeds the limit of {limit}",
        origin(file)
    )]
    LimitExceeded {
        /// The source.
        file: Option<PathBuf>,
        /// "element count" or "byte size".
        what: &'static str,
        /// The count or size.
        value: u64,
        /// The bound.
        limit: u64,
        /// The shape.
        shape: String,
    },
    /// The payload is shorter than the header declares.
    #[error(
        "{}: payload truncated: {present} bytes present, {declared} declared",
        origin(file)
    )]
    TruncatedPayload {
        /// The source.
        file: Option<PathBuf>,
        /// Payload bytes available.
        present: u64,
        /// Payload bytes the header declares.
        declared: u64,
    },
    /// The payload could not be allocated.
    #[error("{}: could not allocate {bytes} bytes for the payload", origin(file))]
    OutOfMemory {
        /// The source.
        file: Option<PathBuf>,
        /// The requested size.
        bytes: u64,
    },
    /// A region's start/stop do not fit the array.
    #[error(
        "{}: region {start:?}..{stop:?} is outside shape {}: {reason}",
        origin(file),
        fmt_shape(shape)
    )]
    InvalidRegion {
        /// The source.
        file: Option<PathBuf>,
        /// The requested start, per axis.
        start: Vec<u64>,
        /// The requested stop (exclusive), per axis.
        stop: Vec<u64>,
        /// The array's shape.
        shape: Vec<u64>,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// The output buffer's length is not the region's byte size.
    #[error(
        "{}: output buffer holds {len} bytes but the region needs {needed}",
        origin(file)
    )]
    OutputSize {
        /// The source.
        file: Option<PathBuf>,
        /// The buffer length given.
        len: usize,
        /// The region's byte size.
        needed: u64,
    },
    /// The file was deleted, replaced, truncated or modified since it was opened.
    #[error("{}: source changed since it was opened: {what}", file.display())]
    SourceChanged {
        /// The path that was opened.
        file: PathBuf,
        /// What changed.
        what: String,
    },
    /// The file is being written (or was written within the stability window), so its
    /// bytes may not be one complete version yet; retry once the write is done.
    #[error("{}: source is being written, retry when the write is done: {what}", file.display())]
    SourceBusy {
        /// The path that was opened.
        file: PathBuf,
        /// What shows the write.
        what: String,
    },
    /// The opened file lies outside the directories it may be served from (a link out of
    /// them); the reason never names where it resolves.
    #[error("{}: {reason}", file.display())]
    Outside {
        /// The path that was opened.
        file: PathBuf,
        /// Why, without the resolved path.
        reason: String,
    },
}

impl NpyError {
    /// The file the error is about, or `None` for bytes held by the caller.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Self::SourceChanged { file, .. }
            | Self::SourceBusy { file, .. }
            | Self::Outside { file, .. } => Some(file),
            Self::Io { file, .. }
            | Self::NotAFile { file, .. }
            | Self::EmptyFile { file }
            | Self::BadMagic { file, .. }
            | Self::UnsupportedVersion { file, .. }
            | Self::HeaderTooLong { file, .. }
            | Self::TruncatedHeader { file, .. }
            | Self::MisalignedHeader { file, .. }
            | Self::HeaderEncoding { file, .. }
            | Self::ObjectDtype { file, .. }
            | Self::StructuredDtype { file, .. }
            | Self::UnsupportedDtype { file, .. }
            | Self::HeaderSyntax { file, .. }
            | Self::UnknownKey { file, .. }
            | Self::DuplicateKey { file, .. }
            | Self::MissingKey { file, .. }
            | Self::NegativeDimension { file, .. }
            | Self::SizeOverflow { file, .. }
            | Self::ScalarShape { file }
            | Self::LimitExceeded { file, .. }
            | Self::TruncatedPayload { file, .. }
            | Self::OutOfMemory { file, .. }
            | Self::InvalidRegion { file, .. }
            | Self::OutputSize { file, .. } => file.as_deref(),
        }
    }
}

impl NpyError {
    /// The error without anything read from the source: no bytes, dtype strings, keys,
    /// shapes, versions or lengths taken from the file, only which check refused it.
    ///
    /// For sources whose content must not be quoted, e.g. a symbolic link that may point
    /// anywhere the server can read (`/etc/passwd`): the full [`Display`](fmt::Display) form
    /// quotes up to 8 bytes of a non-`.npy` file and snippets of a malformed header.
    pub fn without_content(&self) -> String {
        let what = match self {
            Self::Io { .. }
            | Self::NotAFile { .. }
            | Self::EmptyFile { .. }
            | Self::MissingKey { .. }
            | Self::ScalarShape { .. }
            | Self::InvalidRegion { .. }
            | Self::OutputSize { .. }
            | Self::SourceChanged { .. }
            | Self::SourceBusy { .. }
            | Self::Outside { .. } => return self.to_string(),
            Self::BadMagic { .. } => "not a .npy file: it does not begin with the magic \\x93NUMPY",
            Self::UnsupportedVersion { .. } => "unknown .npy version (1.0, 2.0 and 3.0 are read)",
            Self::HeaderTooLong { .. } => "header length exceeds the configured limit",
            Self::TruncatedHeader { .. } => "header truncated",
            Self::MisalignedHeader { .. } => "the header does not end on a multiple of 16 bytes",
            Self::HeaderEncoding { .. } => "header encoding refused",
            Self::ObjectDtype { .. } => "object dtype is refused: its payload is a pickle",
            Self::StructuredDtype { .. } => "structured dtype is refused",
            Self::UnsupportedDtype { .. } => "dtype is not supported",
            Self::HeaderSyntax { .. } => "header refused: not the dict literal numpy writes",
            Self::UnknownKey { .. } => "header holds a key other than descr, fortran_order, shape",
            Self::DuplicateKey { .. } => "a header key appears more than once",
            Self::NegativeDimension { .. } => "a shape dimension is negative",
            Self::SizeOverflow { .. } => "byte size of the shape overflows u64",
            Self::LimitExceeded { what, .. } => {
                return format!(
                    "{}: {what} of the shape exceeds the configured limit",
                    Origin(self.file())
                );
            }
            Self::TruncatedPayload { .. } => "payload truncated: shorter than its header declares",
            Self::OutOfMemory { .. } => "could not allocate the payload",
        };
        format!("{}: {what}", Origin(self.file()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_print_like_numpy() {
        assert_eq!(fmt_shape(&[]), "()");
        assert_eq!(fmt_shape(&[3]), "(3,)");
        assert_eq!(fmt_shape(&[2, 3, 4]), "(2, 3, 4)");
    }

    #[test]
    fn memory_sources_display_as_memory() {
        let err = NpyError::ScalarShape { file: None };
        assert_eq!(err.to_string(), "<memory>: scalar shape () is not served");
        let err = NpyError::UnsupportedDtype {
            file: Some(PathBuf::from("/d/a.npy")),
            descr: "<U7".to_owned(),
        };
        assert_eq!(err.to_string(), "/d/a.npy: dtype '<U7' is not supported");
        assert_eq!(err.file(), Some(Path::new("/d/a.npy")));
    }

    #[test]
    fn without_content_quotes_nothing_from_the_file() {
        let err = NpyError::BadMagic {
            file: Some(PathBuf::from("/d/p.npy")),
            found: "\"root:x:0\"".to_owned(),
        };
        assert!(err.to_string().contains("root:x:0"), "{err}");
        let redacted = err.without_content();
        assert_eq!(
            redacted,
            "/d/p.npy: not a .npy file: it does not begin with the magic \\x93NUMPY"
        );
        let err = NpyError::HeaderSyntax {
            file: Some(PathBuf::from("/d/p.npy")),
            reason: "expected '{', found `secret`".to_owned(),
        };
        assert!(!err.without_content().contains("secret"));
        let err = NpyError::LimitExceeded {
            file: None,
            what: "byte size",
            value: 1 << 40,
            limit: 1 << 30,
            shape: "(1099511627776,)".to_owned(),
        };
        let redacted = err.without_content();
        assert!(!redacted.contains("1099511627776"), "{redacted}");
        assert!(redacted.contains("byte size"), "{redacted}");
    }
}

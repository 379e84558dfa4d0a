//! The store's error type. Every variant names what was refused and why.

use std::path::PathBuf;

/// Errors returned by [`crate::Store`].
#[derive(thiserror::Error, Debug)]
pub enum StoreError {
    /// Another open store (this process or another one) holds `DIR/lock`.
    #[error(
        "segment store {dir} is locked by another process{}",
        holder_suffix(*holder_pid, holder_note.as_deref())
    )]
    Locked {
        /// The cache directory.
        dir: PathBuf,
        /// The pid written into the lock file by the holder, when readable.
        holder_pid: Option<u32>,
        /// What the holder noted about itself ([`crate::Store::note_holder`]), when readable.
        holder_note: Option<String>,
    },
    /// The directory lives on a network (or unknown FUSE) filesystem.
    #[error(
        "segment store {dir} is on a network filesystem ({fstype}); mapped segments could be \
         truncated by another host, so the file cache is refused there (set the network \
         filesystem override to use it anyway)"
    )]
    NetworkFilesystem {
        /// The cache directory.
        dir: PathBuf,
        /// The filesystem type that was detected.
        fstype: String,
    },
    /// The directory was written by another, incompatible format version.
    #[error(
        "segment store {dir} has format version {found}, this build reads version {expected}; \
         the directory is left untouched (use another directory or remove it)"
    )]
    IncompatibleFormat {
        /// The cache directory.
        dir: PathBuf,
        /// What the `FORMAT` file says (or why it could not be read).
        found: String,
        /// The version this build writes and reads.
        expected: u32,
    },
    /// An operating system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the file.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The entry cannot be stored at all (it would not fit the budget or the format).
    #[error("entry of {len} bytes is refused: {reason}")]
    EntryTooLarge {
        /// Encoded length of the entry (or its data length when that is what overflows).
        len: u64,
        /// Why it is refused.
        reason: String,
    },
    /// The entry's metadata cannot be encoded.
    #[error("entry is refused: {reason}")]
    InvalidEntry {
        /// Why it is refused.
        reason: String,
    },
    /// A stored entry does not match its checksum.
    #[error(
        "entry at offset {offset} of {path} fails its checksum (stored crc32c {expected:08x}, \
         computed {found:08x})"
    )]
    ChecksumMismatch {
        /// The segment file.
        path: PathBuf,
        /// Offset of the entry's message.
        offset: u64,
        /// Checksum recorded at write time.
        expected: u32,
        /// Checksum of the bytes now in the file.
        found: u32,
    },
    /// The source file of [`crate::Store::append_from_file`] ended before its range did (it
    /// shrank). Nothing was stored, the segment was sealed at its last good entry, and the
    /// store takes further appends.
    #[error(
        "the source ended after {copied} of the {expected} bytes requested at offset {offset} \
         (it shrank); the entry is not stored and the store stays usable"
    )]
    SourceShort {
        /// Offset of the range in the source.
        offset: u64,
        /// Length of the range.
        expected: u64,
        /// Bytes copied before the source ended.
        copied: u64,
    },
    /// A durability step failed earlier (directory or high-water-mark fsync); writes are refused.
    #[error(
        "segment store {dir} refuses writes: {reason}; restart the store once the disk is healthy"
    )]
    Poisoned {
        /// The cache directory.
        dir: PathBuf,
        /// The failure that poisoned the store.
        reason: String,
    },
    /// The store was closed.
    #[error("segment store {dir} is closed")]
    Closed {
        /// The cache directory.
        dir: PathBuf,
    },
}

impl From<crate::ipc::EncodeError> for StoreError {
    /// An entry that cannot be encoded is refused as too large (a length past the format's
    /// 32-bit offsets) or as invalid (anything else).
    fn from(e: crate::ipc::EncodeError) -> Self {
        match e {
            crate::ipc::EncodeError::TooLong { len, .. } => StoreError::EntryTooLarge {
                len,
                reason: e.to_string(),
            },
            crate::ipc::EncodeError::Invalid(reason) => StoreError::InvalidEntry { reason },
        }
    }
}

fn holder_suffix(pid: Option<u32>, note: Option<&str>) -> String {
    match (pid, note) {
        (Some(pid), Some(note)) => format!(" (pid {pid}, {note})"),
        (Some(pid), None) => format!(" (pid {pid})"),
        (None, Some(note)) => format!(" ({note})"),
        (None, None) => String::new(),
    }
}

impl StoreError {
    /// Wraps an io error with a context naming what was being done.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }
}

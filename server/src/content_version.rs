//! The content version: what a source's bytes are now. Every chunk id carries it, so a
//! source whose bytes may have changed gets new chunk ids and a ticket of the old bytes is
//! refused as stale, never answered with new ones.
//!
//! A version has a kind, which says what it was taken from:
//!
//! * [`FileVersion`], a file's `stat`: device, inode, size and mtime. A `.npy` source's
//!   version, and what the registry and the watcher compare to see a file changed (the
//!   metadata sidecars included).
//! * An upstream tensor's (a tensor of another tensor server served through this one,
//!   `upstream/`): a [`FileVersion`] whose `dev` is [`UPSTREAM_DEV`], which no file has, and
//!   whose `ino` and `mtime_ns` words are a 128-bit digest of what the upstream says the
//!   tensor is (its chunk ids, content version, shape and dtype). It travels in a file's
//!   layout, so chunk ids, scaled reads and descriptors need nothing new
//!   ([`FileVersion::upstream`], docs/decisions/0036).
//! * [`UploadVersion`], an upload's: its uid (never given twice in one state directory),
//!   size and creation time. An upload's bytes never change; a discarded upload added again
//!   under the same name is another upload with another uid.
//!
//! How a version travels inside a chunk id is the codec's business (`chunk_id.rs`: the
//! format byte says the kind); how it travels in a `TensorDescriptor` is
//! [`ContentVersion::descriptor_bytes`].

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

/// What a source's bytes are now; any change of the bytes gives another version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContentVersion {
    /// A file's: its device, inode, size and mtime.
    File(FileVersion),
    /// An upload's: its uid, size and creation time.
    Upload(UploadVersion),
}

/// A file's content version, taken from its `stat`: changed identity means changed bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileVersion {
    /// The device id (`st_dev`).
    pub dev: u64,
    /// The inode number (`st_ino`).
    pub ino: u64,
    /// The size in bytes (`st_size`).
    pub size: u64,
    /// The modification time in nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

/// An upload's content version: its bytes are those the client wrote to this upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UploadVersion {
    /// The upload's uid, never given twice by one state directory.
    pub uid: u64,
    /// The tensor's size in bytes.
    pub size: u64,
    /// When the upload was added, in nanoseconds since the Unix epoch.
    pub created_ns: i64,
}

/// The `dev` word of an upstream tensor's version: no device number a `stat` returns.
pub const UPSTREAM_DEV: u64 = u64::MAX;

impl FileVersion {
    /// An upstream tensor's version: `digest` (of what the upstream says the tensor is)
    /// in the `ino` and `mtime_ns` words, [`UPSTREAM_DEV`] as the device, `size` bytes.
    pub fn upstream(digest: u128, size: u64) -> FileVersion {
        FileVersion {
            dev: UPSTREAM_DEV,
            ino: (digest >> 64) as u64,
            size,
            mtime_ns: digest as u64 as i64,
        }
    }

    /// The version a `stat` result describes.
    pub fn of(meta: &Metadata) -> FileVersion {
        FileVersion {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
        }
    }
}

impl From<FileVersion> for ContentVersion {
    fn from(version: FileVersion) -> Self {
        ContentVersion::File(version)
    }
}

impl From<UploadVersion> for ContentVersion {
    fn from(version: UploadVersion) -> Self {
        ContentVersion::Upload(version)
    }
}

impl PartialEq<FileVersion> for ContentVersion {
    fn eq(&self, other: &FileVersion) -> bool {
        self.file().as_ref() == Some(other)
    }
}

impl ContentVersion {
    /// A file's version; `None` for another kind.
    pub fn file(&self) -> Option<FileVersion> {
        match self {
            ContentVersion::File(v) => Some(*v),
            ContentVersion::Upload(_) => None,
        }
    }

    /// The size in bytes of the source's tensor data (a file's whole size).
    pub fn size(&self) -> u64 {
        match self {
            ContentVersion::File(v) => v.size,
            ContentVersion::Upload(v) => v.size,
        }
    }

    /// The 32 bytes a `TensorDescriptor.content_version` carries (and a ROI grant is sealed
    /// over), each field big-endian: a file's device, inode, size and mtime; an upload's zero
    /// (no device), uid, size and creation time. Informational for clients, who compare it
    /// whole: the two kinds never meet under one array id.
    pub fn descriptor_bytes(&self) -> [u8; 32] {
        let words: [u64; 4] = match *self {
            ContentVersion::File(v) => [v.dev, v.ino, v.size, v.mtime_ns as u64],
            ContentVersion::Upload(v) => [0, v.uid, v.size, v.created_ns as u64],
        };
        let mut out = [0u8; 32];
        for (slot, word) in out.chunks_exact_mut(8).zip(words) {
            slot.copy_from_slice(&word.to_be_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_bytes_are_the_four_words_of_each_kind() {
        let file = ContentVersion::from(FileVersion {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: -1,
        });
        let bytes = file.descriptor_bytes();
        assert_eq!(bytes[7], 1);
        assert_eq!(bytes[15], 2);
        assert_eq!(bytes[23], 3);
        assert_eq!(bytes[24..], [0xff; 8]);
        let upload = ContentVersion::from(UploadVersion {
            uid: 9,
            size: 3,
            created_ns: 4,
        });
        let bytes = upload.descriptor_bytes();
        assert_eq!(bytes[..8], [0; 8]);
        assert_eq!(bytes[15], 9);
        assert_eq!(upload.size(), 3);
        assert_ne!(file, upload);
    }
}

//! Why a TIFF file was refused or one of its reads failed: each names the file and why.

use std::path::PathBuf;

/// A TIFF file refused at open, or a read of it that failed.
#[derive(Debug, thiserror::Error)]
pub enum TiffError {
    /// The file system refused an operation on the file.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not begin with a TIFF or BigTIFF header.
    #[error(
        "{}: not a TIFF file: it begins with {found:?}, not II*\\0, MM\\0*, II+\\0 or MM\\0+",
        path.display()
    )]
    NotTiff {
        /// The file.
        path: PathBuf,
        /// Its first bytes.
        found: Vec<u8>,
    },
    /// Something the file points at lies past its end (a truncated file, a bad offset).
    #[error("{}: a truncated TIFF file: {what} lies past its end ({size} bytes)", path.display())]
    PastEnd {
        /// The file.
        path: PathBuf,
        /// What lies past the end, with its offset and length.
        what: String,
        /// The file's size.
        size: u64,
    },
    /// The chain of image file directories loops.
    #[error(
        "{}: a TIFF file whose directories form a cycle (the directory at offset {offset} is reached twice)",
        path.display()
    )]
    Cycle {
        /// The file.
        path: PathBuf,
        /// The offset reached twice.
        offset: u64,
    },
    /// A directory's tags do not describe an image this reader can lay out.
    #[error("{}: a TIFF file whose page {page} is malformed: {why}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The page (0-based; levels are named `level L page P`).
        page: String,
        /// What is wrong.
        why: String,
    },
    /// A compression this reader does not decode.
    #[error("{}: a TIFF file compressed with {name}: {name} is not read", path.display())]
    Compression {
        /// The file.
        path: PathBuf,
        /// The compression's name (or number).
        name: String,
    },
    /// A sample layout or format that is not one of the dtypes served.
    #[error("{}: a TIFF file with {what}, which is not served", path.display())]
    Samples {
        /// The file.
        path: PathBuf,
        /// The samples refused (`12-bit samples`, `complex integer samples`).
        what: String,
    },
    /// Absurd or over-the-limit dimensions.
    #[error("{}: a TIFF file of {what}, over the limit of {limit}", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// What is too large.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// The pages do not form one tensor, or the metadata contradicts them.
    #[error("{}: a TIFF file whose pages cannot be served as one tensor: {why}", path.display())]
    Pages {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// An OME-TIFF whose image data lives in other files too.
    #[error(
        "{}: a multi-file OME-TIFF set (its OME-XML places planes in {other}): multi-file sets are not read; convert the set, e.g. to OME-Zarr",
        path.display()
    )]
    MultiFile {
        /// The file.
        path: PathBuf,
        /// Another file the set names.
        other: String,
    },
    /// A strip or tile could not be decoded.
    #[error("{}: decoding {chunk} failed: {why}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// Which strip or tile (`page 3 tile 7`).
        chunk: String,
        /// Why.
        why: String,
    },
    /// A strip or tile decompresses to more bytes than its geometry declares.
    #[error(
        "{}: {chunk} decompresses to more than the {declared} bytes its geometry declares (a decompression bomb): refused",
        path.display()
    )]
    Bomb {
        /// The file.
        path: PathBuf,
        /// Which strip or tile.
        chunk: String,
        /// The bytes declared.
        declared: usize,
    },
    /// The file changed since it was opened.
    #[error("{}: the source changed since it was opened ({what}): plan the read again", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        what: String,
    },
    /// The file is being written.
    #[error("{}: the source is being written ({what}): retry once the write is done", path.display())]
    Busy {
        /// The file.
        path: PathBuf,
        /// Why it is thought busy.
        what: String,
    },
    /// The file could not be opened as a regular file (the reason names it).
    #[error("{why}")]
    Open {
        /// Why, with the path.
        why: String,
    },
    /// The opened file lies outside where sources may be.
    #[error("{}: {reason}", path.display())]
    Outside {
        /// The file.
        path: PathBuf,
        /// The placement's refusal.
        reason: String,
    },
}

//! TIFF, BigTIFF and OME-TIFF files as sources (docs/decisions/0032).
//!
//! ```text
//!  file ─▶ ifd.rs: header, main chain of directories + each page's SubIFDs (cycles refused)
//!       ─▶ page.rs: each page's geometry (strips/tiles, chunky/planar, dtype, codec), checked
//!       ─▶ axes.rs: how pages stack (OME-XML, ImageJ description, or one axis)
//!       ─▶ image.rs: the Source; a read decodes only the strips/tiles it overlaps
//!                    (decode.rs: codecs, predictors, decompression bombs refused)
//! ```
//!
//! * Pages of one shape and dtype are one tensor, pages as the slow axes: one axis `z`, an
//!   ImageJ hyperstack's `t, z, c`, or an OME-TIFF's `DimensionOrder` (size-1 axes dropped);
//!   then `y, x`, and samples as `s` (last when chunky, first of the page's when planar).
//! * An OME-TIFF whose pages have SubIFDs is a pyramid: level `L` is the `L`-th SubIFD of
//!   every page, advertised as a native level and served under `<id>.L`.
//! * The grids fit the file: a cell is whole tiles (or strips; uncompressed strips, rows).
//! * The content version is the file's (device, inode, size, mtime): a rewritten file gets
//!   new chunk ids, and a read of an older plan is refused as changed.
//! * Refused by name: truncated files and offsets past the end, chunk counts that do not
//!   match the geometry, circular directory chains, absurd dimensions, compressions and
//!   sample kinds not read (`JPEG 2000 is not read`), multi-file OME-TIFF sets; a chunk that
//!   decompresses to more than it declares is refused at read.

mod axes;
mod decode;
mod error;
mod file;
mod ifd;
mod image;
mod page;

use std::path::Path;
use std::sync::Arc;

pub use error::TiffError;
pub use image::TiffImage;

use axes::{StackError, stacking};
use file::TiffFile;
use ifd::{Reader, read_header, tag};
use image::Described;
use page::{Page, PageError};

use super::Source;
use super::abstraction::{SourceError, SourceErrorKind};
use super::npy::{Limits, Placement};

impl From<TiffError> for SourceError {
    fn from(err: TiffError) -> SourceError {
        let kind = match &err {
            TiffError::Changed { .. } => SourceErrorKind::Changed,
            TiffError::Busy { .. } => SourceErrorKind::Busy,
            _ => SourceErrorKind::Failed,
        };
        SourceError::new(kind, err)
    }
}

/// Whether the file at `path` is claimed as TIFF (by its extension, `.tif` or `.tiff`).
pub fn claims(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("tif") || e.eq_ignore_ascii_case("tiff"))
}

/// Opens the TIFF file at `path` (the registry's opener), or refuses it with the reason
/// clients see.
pub fn open_source(
    path: &Path,
    limits: &Limits,
    place: Option<Placement>,
) -> Result<Arc<dyn Source>, String> {
    open(path, limits, place)
        .map(|image| Arc::new(image) as Arc<dyn Source>)
        .map_err(|e| e.to_string())
}

/// Opens the TIFF file at `path`.
pub fn open(
    path: &Path,
    limits: &Limits,
    place: Option<Placement>,
) -> Result<TiffImage, TiffError> {
    let (file, fd) = TiffFile::open(path, place)?;
    let size = file.identity().size;
    let header = read_header(&fd, path, size).map_err(|e| match e {
        // A link may point anywhere: quote nothing read through it.
        TiffError::NotTiff { path, .. } if is_link(&path) => TiffError::NotTiff {
            path,
            found: Vec::new(),
        },
        other => other,
    })?;
    let walk = Reader::new(&fd, path, size, header).walk()?;
    let malformed = |page: String, err: PageError| match err {
        PageError::Malformed(why) => TiffError::Malformed {
            path: path.to_path_buf(),
            page,
            why,
        },
        PageError::Compression(name) => TiffError::Compression {
            path: path.to_path_buf(),
            name,
        },
        PageError::Samples(what) => TiffError::Samples {
            path: path.to_path_buf(),
            what,
        },
    };
    let mut pages = Vec::with_capacity(walk.pages.len());
    for (i, (dir, _)) in walk.pages.iter().enumerate() {
        let page = Page::from_directory(dir, header.little, size)
            .map_err(|e| malformed(i.to_string(), e))?;
        if let Some(first) = pages.first()
            && !Page::same_shape(first, &page)
        {
            return Err(TiffError::Pages {
                path: path.to_path_buf(),
                why: format!(
                    "page {i} is {:?} {} where page 0 is {:?} {}",
                    page.shape(),
                    page.dtype.numpy_str(),
                    first.shape(),
                    first.dtype.numpy_str()
                ),
            });
        }
        pages.push(page);
    }
    let first = &pages[0];
    let description = walk.pages[0]
        .0
        .bytes(tag::DESCRIPTION)
        .map(|d| String::from_utf8_lossy(d).into_owned());
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stack = stacking(
        description.as_deref(),
        pages.len() as u64,
        first.width,
        first.height,
        first.samples,
        &file_name,
    )
    .map_err(|e| match e {
        StackError::Pages(why) => TiffError::Pages {
            path: path.to_path_buf(),
            why,
        },
        StackError::MultiFile(other) => TiffError::MultiFile {
            path: path.to_path_buf(),
            other,
        },
    })?;
    let mut shape: Vec<u64> = stack.axes.iter().map(|(_, n)| *n).collect();
    shape.extend(first.shape());
    check_size(path, &shape, first.dtype.itemsize as u64, limits)?;
    let physical = (!stack.axis_scale.is_empty() || stack.pixel_scale.is_some()).then(|| {
        let mut scale: Vec<(f64, String)> = stack.axis_scale.clone();
        let [y, x] = stack
            .pixel_scale
            .clone()
            .unwrap_or([(1.0, String::new()), (1.0, String::new())]);
        let one = (1.0, String::new());
        match (first.samples, first.planar) {
            (1, _) => scale.extend([y, x]),
            (_, false) => scale.extend([y, x, one]),
            (_, true) => scale.extend([one, y, x]),
        }
        scale.into_iter().unzip()
    });
    let described = Arc::new(Described {
        flavour: stack.flavour,
        big: header.big,
        axis_labels: stack.axes.iter().map(|(l, _)| l.clone()).collect(),
        axis_sizes: stack.axes.iter().map(|(_, n)| *n).collect(),
        physical,
    });
    let file = Arc::new(file);
    let levels = sub_levels(&walk.pages, header.little, size, first.dtype, &malformed)?;
    let levels = levels
        .into_iter()
        .enumerate()
        .map(|(i, level)| TiffImage::new(file.clone(), described.clone(), level, i + 1))
        .collect();
    Ok(TiffImage::new(file, described, pages, 0).with_levels(levels))
}

/// The pages of each SubIFD level (level `L`: the `L`-th SubIFD of every page), as many
/// levels as every page has, each of one shape and dtype.
fn sub_levels(
    walked: &[(ifd::Directory, Vec<ifd::Directory>)],
    little: bool,
    size: u64,
    dtype: crate::source::npy::Dtype,
    malformed: &dyn Fn(String, PageError) -> TiffError,
) -> Result<Vec<Vec<Page>>, TiffError> {
    let count = walked.iter().map(|(_, subs)| subs.len()).min().unwrap_or(0);
    let mut levels = Vec::with_capacity(count);
    for level in 0..count {
        let mut pages: Vec<Page> = Vec::with_capacity(walked.len());
        for (i, (_, subs)) in walked.iter().enumerate() {
            let page = Page::from_directory(&subs[level], little, size)
                .map_err(|e| malformed(format!("{i} (level {})", level + 1), e))?;
            if pages.first().is_some_and(|f| !f.same_shape(&page)) {
                return Err(malformed(
                    format!("{i} (level {})", level + 1),
                    PageError::Malformed("its level has another shape than page 0's".into()),
                ));
            }
            pages.push(page);
        }
        if pages.first().is_some_and(|p| p.dtype != dtype) {
            break;
        }
        levels.push(pages);
    }
    Ok(levels)
}

fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Refuses a tensor whose elements or bytes are over the limits.
fn check_size(path: &Path, shape: &[u64], itemsize: u64, limits: &Limits) -> Result<(), TiffError> {
    let elements = shape.iter().fold(1u64, |a, &d| a.saturating_mul(d));
    let bytes = elements.saturating_mul(itemsize);
    if elements > limits.max_elements || bytes > limits.max_bytes {
        return Err(TiffError::TooLarge {
            path: path.to_path_buf(),
            what: format!("shape {shape:?} ({bytes} bytes)"),
            limit: limits.max_bytes,
        });
    }
    Ok(())
}

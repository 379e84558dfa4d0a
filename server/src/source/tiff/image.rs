//! A TIFF file as a [`Source`]: its pages stacked into one tensor, each level of an
//! OME-TIFF pyramid (SubIFDs) a [`TiffImage`] of its own served as a native level. A read
//! decodes only the strips or tiles the region overlaps, in parallel up to the machine's
//! cores, each straight from the file with a positional read.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Map, Value, json};

use super::decode::{self, Codec, DecodeError, Expect};
use super::error::TiffError;
use super::file::TiffFile;
use super::page::Page;
use crate::content_version::ContentVersion;
use crate::source::abstraction::{NativeLevel, Scaling, Source, SourceError};
use crate::source::npy::{ByteOrder, Dtype};

/// Most strips or tiles one read decodes at once.
fn decode_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// What a file is, besides its pages: shared by the image and its levels.
#[derive(Debug)]
pub struct Described {
    /// `"tiff"`, `"imagej"` or `"ome-tiff"`.
    pub flavour: &'static str,
    /// BigTIFF.
    pub big: bool,
    /// The page axes' labels, slowest first.
    pub axis_labels: Vec<String>,
    /// The page axes' sizes.
    pub axis_sizes: Vec<u64>,
    /// The full-resolution physical scale of every axis, when the description gives one.
    pub physical: Option<(Vec<f64>, Vec<String>)>,
}

/// One level of a TIFF file: its pages stacked along the page axes.
#[derive(Debug)]
pub struct TiffImage {
    file: Arc<TiffFile>,
    described: Arc<Described>,
    pages: Vec<Page>,
    shape: Vec<u64>,
    dtype: Dtype,
    /// The pyramid level (0: full resolution).
    level: usize,
    /// Its factors against full resolution, per axis.
    factors: Vec<u64>,
    /// The other levels (on level 0 only).
    levels: Vec<Arc<TiffImage>>,
}

impl TiffImage {
    /// The level `level` of the file, made of `pages` (one per page index, same layout).
    pub fn new(
        file: Arc<TiffFile>,
        described: Arc<Described>,
        pages: Vec<Page>,
        level: usize,
    ) -> TiffImage {
        let dtype = pages[0].dtype;
        let mut shape = described.axis_sizes.clone();
        shape.extend(pages[0].shape());
        TiffImage {
            file,
            described,
            pages,
            factors: vec![1; shape.len()],
            shape,
            dtype,
            level,
            levels: Vec::new(),
        }
    }

    /// Adds the pyramid's other levels (their factors against this one).
    pub fn with_levels(mut self, mut levels: Vec<TiffImage>) -> TiffImage {
        for level in &mut levels {
            level.factors = self
                .shape
                .iter()
                .zip(&level.shape)
                .map(|(&b, &l)| {
                    if l == 0 {
                        1
                    } else {
                        ((b as f64 / l as f64).round() as u64).max(1)
                    }
                })
                .collect();
        }
        self.levels = levels.into_iter().map(Arc::new).collect();
        self
    }

    fn page_rank(&self) -> usize {
        self.described.axis_sizes.len()
    }

    fn chunk_name(&self, page: usize, chunk: usize) -> String {
        let kind = if self.pages[page].tiled {
            "tile"
        } else {
            "strip"
        };
        match self.level {
            0 => format!("page {page} {kind} {chunk}"),
            l => format!("level {l} page {page} {kind} {chunk}"),
        }
    }

    /// Reads `start..stop` into `out` (C order): the jobs (one per strip or tile the region
    /// overlaps), decoded in parallel, each copied into its part of `out`.
    fn read_into(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), TiffError> {
        let jobs = self.jobs(start, stop, out.len())?;
        let file = self.file.file()?;
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<TiffError>> = Mutex::new(None);
        let out = Mutex::new(out);
        let threads = decode_threads().min(jobs.len()).max(1);
        let work = || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.jobs.get(i) else { break };
                if failed.lock().is_some() {
                    break;
                }
                match self.decode_job(&file, job) {
                    Ok((bytes, first_row)) => {
                        let mut guard = out.lock();
                        jobs.copy(&self.pages[job.page], job, &bytes, first_row, &mut guard);
                    }
                    Err(err) => {
                        failed.lock().get_or_insert(err);
                        break;
                    }
                }
            }
        };
        if threads == 1 {
            work();
        } else {
            std::thread::scope(|scope| {
                for _ in 0..threads {
                    scope.spawn(work);
                }
            });
        }
        if let Some(err) = failed.into_inner() {
            self.file.check_unchanged()?;
            return Err(err);
        }
        self.file.check_unchanged()
    }

    /// Reads and decodes one job's strip or tile: its bytes and the image row its first
    /// decoded row is (an uncompressed strip is read from the first row the job needs).
    fn decode_job(&self, file: &File, job: &Job) -> Result<(Vec<u8>, u64), TiffError> {
        let page = &self.pages[job.page];
        let offset = page.offsets[job.chunk];
        let count = page.byte_counts[job.chunk];
        let row_bytes = page.chunk_width * page.chunk_samples() * page.dtype.itemsize as u64;
        let rows = page.rows_in(job.down);
        let failed = |why: String| TiffError::Decode {
            path: self.file.path().to_path_buf(),
            chunk: self.chunk_name(job.page, job.chunk),
            why,
        };
        let little = page.dtype.order != ByteOrder::Big;
        if page.codec == Codec::None && !page.tiled && page.predictor == 1 {
            let skip = (job.ya - job.row0) * row_bytes;
            let len = (job.yb - job.ya) * row_bytes;
            if skip + len > count {
                return Err(failed(format!(
                    "it stores {count} bytes, fewer than its {rows} rows of {row_bytes} bytes"
                )));
            }
            let mut buf = vec![0u8; len as usize];
            read_at(file, &mut buf, offset + skip)
                .map_err(|e| failed(format!("reading {len} bytes at {}: {e}", offset + skip)))?;
            return Ok((buf, job.ya));
        }
        let mut raw = vec![0u8; count as usize];
        read_at(file, &mut raw, offset)
            .map_err(|e| failed(format!("reading {count} bytes at {offset}: {e}")))?;
        let expect = Expect {
            declared: page.chunk_bytes() as usize,
            needed: (rows * row_bytes) as usize,
            samples: page.chunk_samples() as usize,
        };
        let mut bytes = decode::decode(page.codec, &raw, page.jpeg_tables.as_deref(), expect)
            .map_err(|e| match e {
                DecodeError::Bomb => TiffError::Bomb {
                    path: self.file.path().to_path_buf(),
                    chunk: self.chunk_name(job.page, job.chunk),
                    declared: expect.declared,
                },
                DecodeError::Failed(why) => failed(why),
            })?;
        if page.predictor != 1 {
            let from = ((job.ya - job.row0) * row_bytes) as usize;
            decode::undo_predictor(
                page.predictor,
                &mut bytes[from..],
                (job.yb - job.ya) as usize,
                page.chunk_width as usize,
                page.chunk_samples() as usize,
                page.dtype.itemsize,
                little,
            );
        }
        Ok((bytes, job.row0))
    }

    /// The jobs of a read of `start..stop` into a buffer of `len` bytes.
    fn jobs(&self, start: &[u64], stop: &[u64], len: usize) -> Result<Jobs, TiffError> {
        let rank = self.shape.len();
        let bad = |why: String| TiffError::Decode {
            path: self.file.path().to_path_buf(),
            chunk: "a region".into(),
            why,
        };
        if start.len() != rank
            || stop.len() != rank
            || start
                .iter()
                .zip(stop)
                .zip(&self.shape)
                .any(|((a, b), d)| a > b || b > d)
        {
            return Err(bad(format!(
                "{start:?}..{stop:?} is not a region of shape {:?}",
                self.shape
            )));
        }
        let isz = self.dtype.itemsize as u64;
        let extent: Vec<u64> = start.iter().zip(stop).map(|(a, b)| b - a).collect();
        let mut strides = vec![isz; rank];
        for i in (0..rank.saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * extent[i + 1];
        }
        if extent.iter().product::<u64>() * isz != len as u64 {
            return Err(bad(format!(
                "the buffer holds {len} bytes, not the region's"
            )));
        }
        let k = self.page_rank();
        let page0 = &self.pages[0];
        // The page's own axes: (y, x, s) positions in the region's axes.
        let (ya, xa, sa) = match (page0.samples, page0.planar) {
            (1, _) => (k, k + 1, None),
            (_, false) => (k, k + 1, Some(k + 2)),
            (_, true) => (k + 1, k + 2, Some(k)),
        };
        let (s0, s1) = sa.map_or((0, 1), |a| (start[a], stop[a]));
        let finish = |jobs: Vec<Job>| Jobs {
            jobs,
            y0: start[ya],
            x0: start[xa],
            s0,
            s1,
            sy: strides[ya],
            sx: strides[xa],
            ss: sa.map_or(0, |a| strides[a]),
        };
        let mut jobs = Vec::new();
        if extent.contains(&0) {
            return Ok(finish(jobs));
        }
        let sizes = &self.described.axis_sizes;
        let mut index: Vec<u64> = start[..k].to_vec();
        loop {
            let page = index
                .iter()
                .zip(sizes)
                .fold(0u64, |acc, (&i, &n)| acc * n + i) as usize;
            let base: u64 = index
                .iter()
                .zip(start)
                .zip(&strides)
                .map(|((&i, &s), &st)| (i - s) * st)
                .sum();
            let p = &self.pages[page];
            let planes = if p.planar { s0..s1 } else { 0..1 };
            let (across, down) = p.grid();
            let (cw, ch) = (p.chunk_width, p.chunk_height);
            for plane in planes {
                for cy in start[ya] / ch..stop[ya].div_ceil(ch).min(down) {
                    let row0 = cy * ch;
                    let rows = p.rows_in(cy);
                    for cx in start[xa] / cw..stop[xa].div_ceil(cw).min(across) {
                        jobs.push(Job {
                            page,
                            chunk: ((plane * down + cy) * across + cx) as usize,
                            plane,
                            down: cy,
                            row0,
                            col0: cx * cw,
                            ya: start[ya].max(row0),
                            yb: stop[ya].min(row0 + rows),
                            xa: start[xa].max(cx * cw),
                            xb: stop[xa].min((cx + 1) * cw).min(p.width),
                            base,
                        });
                    }
                }
            }
            // The next page index in C order within the region.
            let mut axis = k;
            loop {
                if axis == 0 {
                    return Ok(finish(jobs));
                }
                axis -= 1;
                index[axis] += 1;
                if index[axis] < stop[axis] {
                    break;
                }
                index[axis] = start[axis];
            }
        }
    }

    fn physical(&self) -> Option<(Vec<f64>, Vec<String>)> {
        let (scale, units) = self.described.physical.clone()?;
        Some((
            scale
                .iter()
                .zip(&self.factors)
                .map(|(s, &f)| s * f as f64)
                .collect(),
            units,
        ))
    }
}

/// One strip or tile a read decodes, and the part of it the region takes.
#[derive(Debug)]
struct Job {
    page: usize,
    chunk: usize,
    plane: u64,
    /// The chunk row (strips and tiles down).
    down: u64,
    /// The image row and column of its first pixel.
    row0: u64,
    col0: u64,
    /// The image rows and columns the region takes from it.
    ya: u64,
    yb: u64,
    xa: u64,
    xb: u64,
    /// Where its page's part of the region starts in the output.
    base: u64,
}

/// A read's jobs and where their parts go.
struct Jobs {
    jobs: Vec<Job>,
    y0: u64,
    x0: u64,
    s0: u64,
    s1: u64,
    /// Output strides (bytes) along y, x and samples.
    sy: u64,
    sx: u64,
    ss: u64,
}

impl Jobs {
    fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Copies the region's part of a decoded chunk (`first_row` its first row) into `out`.
    fn copy(&self, page: &Page, job: &Job, bytes: &[u8], first_row: u64, out: &mut [u8]) {
        let isz = page.dtype.itemsize as u64;
        let cs = page.chunk_samples();
        let row_bytes = page.chunk_width * cs * isz;
        let whole_pixels = page.planar || page.samples == 1 || (self.s0 == 0 && self.s1 == cs);
        let plane_base = if page.planar {
            (job.plane - self.s0) * self.ss
        } else {
            0
        };
        let cols = job.xb - job.xa;
        for y in job.ya..job.yb {
            let src = ((y - first_row) * row_bytes + (job.xa - job.col0) * cs * isz) as usize;
            let dst =
                (job.base + plane_base + (y - self.y0) * self.sy + (job.xa - self.x0) * self.sx)
                    as usize;
            if whole_pixels {
                let n = (cols * cs * isz) as usize;
                out[dst..dst + n].copy_from_slice(&bytes[src..src + n]);
            } else {
                let n = ((self.s1 - self.s0) * isz) as usize;
                for x in 0..cols as usize {
                    let from = src + x * (cs * isz) as usize + (self.s0 * isz) as usize;
                    let to = dst + x * self.sx as usize;
                    out[to..to + n].copy_from_slice(&bytes[from..from + n]);
                }
            }
        }
    }
}

fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    file.read_exact_at(buf, offset)
}

impl Source for TiffImage {
    fn format(&self) -> &'static str {
        if self.described.flavour == "ome-tiff" {
            "ome-tiff"
        } else {
            "tiff"
        }
    }

    fn path(&self) -> &Path {
        self.file.path()
    }

    fn shape(&self) -> &[u64] {
        &self.shape
    }

    fn dtype(&self) -> &Dtype {
        &self.dtype
    }

    fn native_chunk(&self) -> Option<Vec<u64>> {
        let mut chunk = vec![1; self.page_rank()];
        chunk.extend(self.pages[0].native_chunk());
        Some(chunk)
    }

    fn version(&self) -> ContentVersion {
        ContentVersion::File(self.file.identity())
    }

    fn dim_labels(&self) -> Option<Vec<String>> {
        let page = &self.pages[0];
        let mut labels = self.described.axis_labels.clone();
        let tail: &[&str] = match (page.samples, page.planar) {
            (1, _) => &["y", "x"],
            (_, false) => &["y", "x", "s"],
            (_, true) => &["s", "y", "x"],
        };
        labels.extend(tail.iter().map(|s| s.to_string()));
        Some(labels)
    }

    fn physical_scale(&self) -> Option<(Vec<f64>, Vec<String>)> {
        self.physical()
    }

    fn format_metadata(&self) -> Map<String, Value> {
        let page = &self.pages[0];
        let mut map = Map::new();
        map.insert("path".into(), json!(self.file.path().display().to_string()));
        map.insert("tiff_flavour".into(), json!(self.described.flavour));
        map.insert("bigtiff".into(), json!(self.described.big));
        map.insert("pages".into(), json!(self.pages.len()));
        map.insert("compression".into(), json!(format!("{:?}", page.codec)));
        map.insert(
            if page.tiled {
                "tile_shape"
            } else {
                "strip_shape"
            }
            .into(),
            json!([page.chunk_height, page.chunk_width]),
        );
        if self.level > 0 {
            map.insert("level".into(), json!(self.level));
        }
        map
    }

    fn scaling(&self) -> Scaling {
        if self.levels.is_empty() {
            return Scaling::Computed;
        }
        let mut levels = vec![NativeLevel {
            path: "0".into(),
            factors: vec![1; self.shape.len()],
            shape: self.shape.clone(),
        }];
        levels.extend(self.levels.iter().map(|l| NativeLevel {
            path: l.level.to_string(),
            factors: l.factors.clone(),
            shape: l.shape.clone(),
        }));
        Scaling::Native { levels }
    }

    fn level(&self, path: &str) -> Option<Arc<dyn Source>> {
        self.levels
            .iter()
            .find(|l| l.level.to_string() == path)
            .map(|l| l.clone() as Arc<dyn Source>)
    }

    fn is_resident(&self) -> bool {
        self.file.path().is_file()
    }

    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        Ok(self.read_into(start, stop, out)?)
    }

    fn settle(&self, window: Duration) -> Result<(), SourceError> {
        Ok(self.file.settle(window)?)
    }

    fn check_unchanged(&self) -> Result<(), SourceError> {
        Ok(self.file.check_unchanged()?)
    }

    fn check_no_writer(&self) -> Result<(), SourceError> {
        Ok(self.file.check_no_writer()?)
    }
}

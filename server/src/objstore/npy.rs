//! A `.npy` object as a [`Source`]: the header read with one range request at open (two
//! when it is longer than the first guess), each region read as the byte ranges of its
//! runs (neighbouring runs fetched as one request), only while the object's ETag is the
//! listed one. The chunk service keeps each cell in the segment cache like a file's.

use std::ops::Range;
use std::path::{Path, PathBuf};

use object_store::ObjectMeta;
use object_store::path::Path as ObjectPath;
use serde_json::{Map, Value, json};

use crate::content_version::{ContentVersion, FileVersion};
use crate::objstore::client::Client;
use crate::objstore::error::ObjectStoreError;
use crate::source::npy::{
    Dtype, Header, Limits, NpyError, Runs, gather, parse_header, stored_runs,
};
use crate::source::{Source, SourceError, SourceErrorKind};

/// Bytes asked for first: the header of every `.npy` numpy writes fits (it pads to 64).
const FIRST_READ: u64 = 4096;

/// Runs this close together are fetched as one request (the bytes between are read and
/// dropped): one request per run of a tile of a wide plane would be thousands.
const COALESCE_GAP: u64 = 1 << 20;

/// One `.npy` object.
#[derive(Debug)]
pub struct NpyObject {
    client: Client,
    location: ObjectPath,
    url: PathBuf,
    header: Header,
    e_tag: Option<String>,
    version: FileVersion,
}

impl NpyObject {
    /// Opens the object `meta` lists (its version `version`): reads and checks its header,
    /// refuses an object shorter than its header declares. Blocking.
    pub fn open(
        client: &Client,
        meta: &ObjectMeta,
        version: FileVersion,
        limits: &Limits,
    ) -> Result<NpyObject, ObjectStoreError> {
        let url = client.address().url_of(meta.location.as_ref());
        let refuse = |why: String| ObjectStoreError::Refused {
            url: url.clone(),
            why,
        };
        if meta.size == 0 {
            return Err(refuse("it is empty".to_string()));
        }
        let e_tag = meta.e_tag.as_deref();
        let mut len = FIRST_READ.min(meta.size);
        let header = loop {
            let prefix = client
                .get_ranges(&meta.location, std::slice::from_ref(&(0..len)), e_tag)?
                .pop()
                .unwrap_or_default();
            match parse_header(&prefix, limits) {
                Ok(header) => break header,
                Err(NpyError::TruncatedHeader { needed, .. })
                    if needed > len && needed <= meta.size =>
                {
                    len = needed;
                }
                Err(err) => return Err(refuse(err.to_string())),
            }
        };
        let end = header.data_offset.saturating_add(header.data_len);
        if end > meta.size {
            return Err(refuse(format!(
                "it is truncated: it holds {} bytes, its header declares {end} (shape {:?}, dtype {})",
                meta.size,
                header.shape,
                header.dtype.numpy_str()
            )));
        }
        Ok(NpyObject {
            client: client.clone(),
            location: meta.location.clone(),
            url: PathBuf::from(url),
            header,
            e_tag: meta.e_tag.clone(),
            version,
        })
    }

    /// Reads the runs of `start..stop` as stored into `stored` (concatenated, in stored
    /// order).
    fn read_runs(&self, runs: Runs, stored: &mut [u8]) -> Result<(), ObjectStoreError> {
        let run_len = runs.run_len();
        let base = self.header.data_offset;
        let offsets: Vec<u64> = runs.map(|o| base + o).collect();
        let groups = coalesce(&offsets, run_len);
        let ranges: Vec<Range<u64>> = groups.iter().map(|g| g.range.clone()).collect();
        let fetched = self
            .client
            .get_ranges(&self.location, &ranges, self.e_tag.as_deref())?;
        let mut at = 0usize;
        for (group, bytes) in groups.iter().zip(&fetched) {
            for &offset in &offsets[group.runs.clone()] {
                let from = (offset - group.range.start) as usize;
                let len = run_len as usize;
                stored[at..at + len].copy_from_slice(&bytes[from..from + len]);
                at += len;
            }
        }
        Ok(())
    }
}

/// Neighbouring runs fetched as one request.
#[derive(Debug, PartialEq)]
struct Group {
    /// The bytes fetched.
    range: Range<u64>,
    /// Which runs (indices into the offsets) it holds.
    runs: Range<usize>,
}

/// Groups runs of `run_len` bytes at ascending `offsets` whose gaps are at most
/// [`COALESCE_GAP`].
fn coalesce(offsets: &[u64], run_len: u64) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (index, &offset) in offsets.iter().enumerate() {
        match groups.last_mut() {
            Some(last) if offset <= last.range.end.saturating_add(COALESCE_GAP) => {
                last.range.end = offset + run_len;
                last.runs.end = index + 1;
            }
            _ => groups.push(Group {
                range: offset..offset + run_len,
                runs: index..index + 1,
            }),
        }
    }
    groups
}

impl Source for NpyObject {
    fn format(&self) -> &'static str {
        "npy"
    }

    fn path(&self) -> &Path {
        &self.url
    }

    fn shape(&self) -> &[u64] {
        &self.header.shape
    }

    fn dtype(&self) -> &Dtype {
        &self.header.dtype
    }

    fn fortran_order(&self) -> bool {
        !self.header.is_c_layout()
    }

    fn version(&self) -> ContentVersion {
        ContentVersion::File(self.version)
    }

    fn format_metadata(&self) -> Map<String, Value> {
        let mut map = Map::new();
        let (major, minor) = self.header.version;
        map.insert("npy_version".into(), json!(format!("{major}.{minor}")));
        map.insert("fortran_order".into(), json!(self.header.fortran_order));
        if let Some(e_tag) = &self.e_tag {
            map.insert("etag".into(), json!(e_tag));
        }
        map
    }

    fn is_resident(&self) -> bool {
        false
    }

    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        let shape = &self.header.shape;
        let fits = start.len() == shape.len()
            && stop.len() == shape.len()
            && start
                .iter()
                .zip(stop)
                .zip(shape)
                .all(|((a, b), d)| a <= b && b <= d);
        let itemsize = self.header.dtype.itemsize;
        let needed = start
            .iter()
            .zip(stop)
            .try_fold(itemsize as u64, |acc, (a, b)| acc.checked_mul(b - a));
        if !fits || needed != Some(out.len() as u64) {
            return Err(SourceError::new(
                SourceErrorKind::Refused,
                format!(
                    "region {start:?}..{stop:?} of {} does not fit its shape {shape:?} and a buffer of {} bytes",
                    self.url.display(),
                    out.len()
                ),
            ));
        }
        if out.is_empty() {
            return Ok(());
        }
        let runs = stored_runs(&self.header, start, stop);
        if self.header.is_c_layout() {
            return self.read_runs(runs, out).map_err(|e| e.to_source_error());
        }
        // Fortran order: the runs are the region in Fortran order; gather it into C order.
        let mut stored = vec![0u8; out.len()];
        self.read_runs(runs, &mut stored)
            .map_err(|e| e.to_source_error())?;
        let extent: Vec<usize> = start
            .iter()
            .zip(stop)
            .map(|(a, b)| (b - a) as usize)
            .collect();
        let mut strides = Vec::with_capacity(extent.len());
        let mut acc = itemsize;
        for &n in &extent {
            strides.push(acc);
            acc *= n.max(1);
        }
        gather(&stored, 0, &strides, &extent, itemsize, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_runs_are_fetched_together_and_far_ones_apart() {
        let far = COALESCE_GAP + 200;
        let groups = coalesce(&[100, 300, 500, 500 + far], 100);
        assert_eq!(
            groups,
            [
                Group {
                    range: 100..600,
                    runs: 0..3
                },
                Group {
                    range: 500 + far..600 + far,
                    runs: 3..4
                },
            ]
        );
        assert!(coalesce(&[], 8).is_empty());
    }
}

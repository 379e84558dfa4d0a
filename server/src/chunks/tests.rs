//! The chunk service's single flight, with a source that counts its reads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::content_version::{ContentVersion, FileVersion};
use crate::grid::ChunkGrid;
use crate::source::npy::Dtype;
use crate::source::origin::Origin;
use crate::source::{Source, SourceError};

/// A `u1` vector of zeros that counts how often a region of it is read.
#[derive(Debug)]
struct Counted {
    shape: Vec<u64>,
    dtype: Dtype,
    reads: AtomicUsize,
}

impl Source for Counted {
    fn format(&self) -> &'static str {
        "counted"
    }

    fn path(&self) -> &Path {
        Path::new("/nonexistent/counted")
    }

    fn shape(&self) -> &[u64] {
        &self.shape
    }

    fn dtype(&self) -> &Dtype {
        &self.dtype
    }

    fn version(&self) -> ContentVersion {
        ContentVersion::File(FileVersion {
            dev: 1,
            ino: 2,
            size: self.shape[0],
            mtime_ns: 3,
        })
    }

    fn read_region(&self, _: &[u64], _: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        out.fill(0);
        Ok(())
    }
}

fn counted() -> (Arc<Counted>, Arc<Tensor>) {
    let source = Arc::new(Counted {
        shape: vec![64],
        dtype: Dtype::parse("|u1").unwrap(),
        reads: AtomicUsize::new(0),
    });
    let grid = ChunkGrid::plan(&source.shape, 1, false, 16).unwrap();
    let tensor = Arc::new(Tensor {
        array_id: "counted".to_string(),
        source_id: "counted".to_string(),
        version: source.version(),
        dim_labels: vec!["x".to_string()],
        mapped_grid: grid.clone(),
        grid,
        origin: Origin::Configured,
        meta: Default::default(),
        source: source.clone(),
    });
    (source, tensor)
}

#[tokio::test]
async fn a_chunk_stored_after_its_reader_found_it_cold_is_not_read_again() {
    let (source, tensor) = counted();
    let store = MemoryStore::new(1 << 20, "a test".to_string()).unwrap();
    let service = Arc::new(ChunkService::new(Arc::new(store), 1 << 20, 2));
    let id = ChunkId::new("counted", tensor.version, Region::new(vec![16], vec![32])).unwrap();
    let key = id.segment_key();

    // Two readers both found the chunk cold; the first one's run ended (and stored it)
    // before the second reached the single flight.
    service.materialize(&tensor, &id, &key).await.unwrap();
    service.materialize(&tensor, &id, &key).await.unwrap();

    assert_eq!(source.reads.load(Ordering::SeqCst), 1);
    assert!(service.cached(&key).unwrap().is_some());
}

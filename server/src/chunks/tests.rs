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

/// A `u1` vector of zeros whose reads take a while, recording how many ran at once.
#[derive(Debug)]
struct Slow {
    shape: Vec<u64>,
    dtype: Dtype,
    over_link: bool,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl Source for Slow {
    fn format(&self) -> &'static str {
        "slow"
    }

    fn path(&self) -> &Path {
        Path::new("/nonexistent/slow")
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
            ino: 4,
            size: self.shape[0],
            mtime_ns: 5,
        })
    }

    fn waits_on_link(&self) -> bool {
        self.over_link
    }

    fn read_region(&self, _: &[u64], _: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(300));
        out.fill(0);
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The most reads of a slow source running at once while 6 of its chunks are asked for
/// together, from a service of 2 decode permits and 4 upstream fetches.
async fn most_at_once(over_link: bool) -> usize {
    let source = Arc::new(Slow {
        shape: vec![96],
        dtype: Dtype::parse("|u1").unwrap(),
        over_link,
        running: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let grid = ChunkGrid::plan(&source.shape, 1, false, 16).unwrap();
    let tensor = Arc::new(Tensor {
        array_id: "slow".to_string(),
        source_id: "slow".to_string(),
        version: source.version(),
        dim_labels: vec!["x".to_string()],
        mapped_grid: grid.clone(),
        grid,
        origin: Origin::Configured,
        meta: Default::default(),
        source: source.clone(),
    });
    let store = MemoryStore::new(1 << 20, "a test".to_string()).unwrap();
    let service = Arc::new(ChunkService::new(Arc::new(store), 1 << 20, 2).with_upstream_fetches(4));
    let mut reads = Vec::new();
    for start in (0..96).step_by(16) {
        let id = ChunkId::new(
            "slow",
            tensor.version,
            Region::new(vec![start], vec![start + 16]),
        )
        .unwrap();
        let (service, tensor) = (service.clone(), tensor.clone());
        reads.push(tokio::spawn(async move {
            let key = id.segment_key();
            service.materialize(&tensor, &id, &key).await.map(|_| ())
        }));
    }
    for read in reads {
        read.await.unwrap().unwrap();
    }
    source.most.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_over_a_link_take_the_larger_pool_of_fetches() {
    assert_eq!(most_at_once(true).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_reads_take_the_decode_permits() {
    assert_eq!(most_at_once(false).await, 2);
}

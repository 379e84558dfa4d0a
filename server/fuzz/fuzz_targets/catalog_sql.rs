//! Fuzzes the catalog's SQL text (the `catalog_query` ticket arm) through the whole engine:
//! parse, the refusal of anything but a query, the plan-size gate, execution and the row,
//! byte and time bounds, over the catalog tables of three small tensors. No input may panic
//! the caller or outlive the query timeout; an answer never exceeds the row bound.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use tessera_server::catalog::{Catalog, CatalogLimits, Snapshot};
use tessera_server::source::npy::Limits;
use tessera_server::source::registry::{OpenOptions, Registry};

struct Fixture {
    runtime: tokio::runtime::Runtime,
    catalog: Catalog,
    snapshot: Snapshot,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tessera-fuzz-sql-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for (i, (descr, shape)) in [("<u2", "(4, 8)"), ("<f4", "(2, 3, 4)"), ("|u1", "(5,)")]
            .iter()
            .enumerate()
        {
            let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
            let mut header = header.into_bytes();
            while (10 + header.len() + 1) % 64 != 0 {
                header.push(b' ');
            }
            header.push(b'\n');
            let mut file = b"\x93NUMPY\x01\x00".to_vec();
            file.extend_from_slice(&(header.len() as u16).to_le_bytes());
            file.extend_from_slice(&header);
            file.extend_from_slice(&[7u8; 256]);
            std::fs::write(dir.join(format!("t{i}.npy")), file).expect("write source");
        }
        // A malformed one, so `sources` has a refused row.
        std::fs::write(dir.join("bad.npy"), b"not a numpy file").expect("write source");
        let options = OpenOptions {
            limits: Limits::default(),
            target_chunk_bytes: 1 << 10,
        };
        let (registry, _problems) = Registry::scan(&[dir.into()], &options);
        let limits = CatalogLimits {
            max_rows: 1_000,
            timeout: Duration::from_secs(2),
            ..CatalogLimits::default()
        };
        Fixture {
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
            catalog: Catalog::new(limits),
            snapshot: Snapshot::of(&registry),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let sql = String::from_utf8_lossy(data);
    let f = fixture();
    let started = Instant::now();
    let answer = f.runtime.block_on(f.catalog.query(&f.snapshot, &sql));
    assert!(
        started.elapsed() < f.catalog.limits().timeout * 2 + Duration::from_secs(1),
        "a query outlived its timeout"
    );
    if let Ok(answer) = answer {
        assert!(answer.returned_rows <= f.catalog.limits().max_rows);
    }
});

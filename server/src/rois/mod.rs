//! ROI annotations: what a viewer user draws on a served tensor (a rectangle round a cell,
//! a label), kept in the state directory and served on the `roi` flight.
//!
//! ```text
//!  DoPut roi_put rows ──▶ rows::from_batch ─▶ prepare (geometry, ids, caps) ─▶ store.put
//!  DoPut roi_delete ids ─────────────────────────────────────────────────────▶ store.delete
//!  DoGet roi_read ──▶ seal::check (a grant in place of the token) ───────────▶ store.list
//!  GetFlightInfo ──▶ roi_ticket = RoiRead{array_id, seal::grant}
//!  action roi_prune ──────────────────────────────────────────────────────────▶ store.prune
//! ```
//!
//! * [`geometry`] checks `biopb.image.ROI` JSON and writes its canonical form;
//! * [`rows`] is the Arrow ROI row schema, both ways;
//! * [`store`] is the redb database (one transaction per call, fsync before the ack);
//! * [`seal`] makes and checks the grants of ROI tickets.

pub mod db;
pub mod geometry;
pub mod rows;
pub mod seal;

use std::collections::HashSet;
use std::path::Path;

use tessera_proto::image_pb::{RoiAnnotation, RoiConflict, RoiPutResult};
use tessera_proto::pb::RoiGrant;

use db::{Batch, Listing, NewRoi, PruneOutcome, RoiDb, RoiDbError, StoredRoi};
use geometry::Shape;
use rows::IncomingRoi;
use seal::{GrantError, KeyError, Sealer};

/// Set names starting with this are the server's (imported from a source file): clients
/// may read them by name but never write them. Tessera imports none yet.
pub const RESERVED_SET_PREFIX: &str = "@";

/// The set of an annotation sent without one.
pub const DEFAULT_SET: &str = "default";

/// Bounds on what clients may store.
#[derive(Debug, Clone)]
pub struct RoiLimits {
    /// Most client-owned annotations one tensor may hold; also the most a read returns
    /// (more are cut and the read says `truncated`).
    pub max_rois_per_tensor: u64,
    /// Largest annotation, in bytes of its stored text (ids, label, geometry, props).
    pub max_row_bytes: usize,
    /// Longest client-chosen `roi_id` and `set_name`, in characters.
    pub max_name_chars: usize,
    /// Memory the database may keep as its page cache (`annotation_cache`).
    pub cache_bytes: usize,
}

impl Default for RoiLimits {
    fn default() -> Self {
        Self {
            max_rois_per_tensor: 10_000,
            max_row_bytes: 64 << 10,
            max_name_chars: 128,
            cache_bytes: db::DEFAULT_CACHE_BYTES,
        }
    }
}

/// Why an annotation call was refused for what it asked, with the values refused.
#[derive(Debug, thiserror::Error)]
pub enum RoiRefusal {
    /// The system gave no random bytes to mint an id with.
    #[error("no random bytes to mint a roi_id")]
    NoRandomness,
    /// A row names another tensor than the put.
    #[error("annotation array_id '{given}' does not match the put's '{asked}'")]
    OtherTensor {
        /// The row's `array_id`.
        given: String,
        /// The id the put named its tensor by.
        asked: String,
    },
    /// A `roi_id` over the name limit.
    #[error("roi_id '{prefix}…' is longer than {max} characters")]
    LongId {
        /// Its first 32 characters.
        prefix: String,
        /// The limit (`max_name_chars`).
        max: usize,
    },
    /// A `roi_id` with a comma.
    #[error("roi_id '{id}' may not contain a comma")]
    CommaInId {
        /// The id.
        id: String,
    },
    /// A write to a set the server owns.
    #[error(
        "set_name '{set_name}' is in the reserved '{RESERVED_SET_PREFIX}' namespace, which the \
         server owns; copy the set into one of your own to edit it"
    )]
    ReservedSetWrite {
        /// The set.
        set_name: String,
    },
    /// A `set_name` over the name limit.
    #[error("set_name is longer than {max} characters")]
    LongSetName {
        /// The limit (`max_name_chars`).
        max: usize,
    },
    /// A geometry that is not `biopb.image.ROI` JSON.
    #[error("annotation {name}: {source}")]
    Geometry {
        /// The annotation's id (`<new>` for one without).
        name: String,
        /// What is wrong with it.
        #[source]
        source: geometry::GeometryError,
    },
    /// An annotation whose stored text would be over the row limit.
    #[error(
        "annotation {name} is {bytes} bytes, more than the {max} one annotation may be \
         (max_roi_bytes)"
    )]
    RowTooLarge {
        /// The annotation's id (`<new>` for one without).
        name: String,
        /// Its stored text's bytes.
        bytes: usize,
        /// The limit (`max_row_bytes`).
        max: usize,
    },
    /// One `roi_id` twice in a batch.
    #[error("roi_id '{id}' appears twice in one batch")]
    DuplicateId {
        /// The id.
        id: String,
    },
    /// A delete of a set the server owns.
    #[error(
        "set_name '{set_name}' is reserved: the server owns it, there is nothing for a client \
         to delete"
    )]
    ReservedSetDelete {
        /// The set.
        set_name: String,
    },
    /// A prune of annotations unseen for no time.
    #[error("roi_prune: unseen_days is {unseen_days}; it must be positive")]
    UnseenDays {
        /// The value sent.
        unseen_days: i32,
    },
}

/// Why an annotation call failed.
#[derive(Debug, thiserror::Error)]
pub enum RoiError {
    /// The caller's request was refused.
    #[error(transparent)]
    Refused(#[from] RoiRefusal),
    /// A sealed grant did not let its holder read.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The store failed or refused (the cap).
    #[error(transparent)]
    Db(#[from] RoiDbError),
    /// The seal key could not be loaded.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// The annotations of one server: the store and the sealer, in `STATE_DIR/annotations`.
#[derive(Debug)]
pub struct Annotations {
    store: RoiDb,
    sealer: Sealer,
    limits: RoiLimits,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A fresh uuid4, as 32 lowercase hex digits.
fn mint_id() -> Result<String, RoiError> {
    let mut bytes = seal::random_bytes::<16>().ok_or(RoiRefusal::NoRandomness)?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Annotations {
    /// Opens the store in `dir` (the state directory's `annotations`), sealing with
    /// `shared` (the key replicas share, `--seal-key-file`) or else with the key of `dir`.
    pub fn open(
        dir: &Path,
        limits: RoiLimits,
        shared: Option<Sealer>,
    ) -> Result<Annotations, RoiError> {
        let sealer = match shared {
            Some(sealer) => sealer,
            None => Sealer::open(&dir.join("seal.key"))?,
        };
        Ok(Annotations {
            store: RoiDb::open(&dir.join("rois.redb"), limits.cache_bytes)?,
            sealer,
            limits,
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> &RoiLimits {
        &self.limits
    }

    /// Checks one incoming annotation of a batch on `array_id` (`asked` is the id the
    /// client named the tensor by) and turns it into the record to write.
    fn prepare(&self, array_id: &str, asked: &str, roi: IncomingRoi) -> Result<NewRoi, RoiError> {
        if !roi.array_id.is_empty() && roi.array_id != array_id && roi.array_id != asked {
            return Err(RoiRefusal::OtherTensor {
                given: roi.array_id,
                asked: asked.to_string(),
            }
            .into());
        }
        let id = roi.roi_id.trim().to_string();
        let max = self.limits.max_name_chars;
        if id.chars().count() > max {
            return Err(RoiRefusal::LongId {
                prefix: id.chars().take(32).collect(),
                max,
            }
            .into());
        }
        if id.contains(',') {
            return Err(RoiRefusal::CommaInId { id }.into());
        }
        let set_name = if roi.set_name.is_empty() {
            DEFAULT_SET.to_string()
        } else {
            roi.set_name
        };
        if set_name.starts_with(RESERVED_SET_PREFIX) {
            return Err(RoiRefusal::ReservedSetWrite { set_name }.into());
        }
        if set_name.chars().count() > max {
            return Err(RoiRefusal::LongSetName { max }.into());
        }
        let name = if id.is_empty() { "<new>" } else { id.as_str() };
        let size = |geometry: &str| {
            id.len()
                + set_name.len()
                + roi.label.len()
                + geometry.len()
                + roi.props_json.len()
                + roi.drawn_against_version.as_ref().map_or(0, Vec::len)
                + roi.plane.len() * 8
        };
        // The text as sent is measured before it is parsed: parsing a JSON value costs
        // tens of times its text (a 2.6 MB polygon took over 100 MB), so an oversized
        // geometry must never reach the parser.
        self.check_row_bytes(name, size(&roi.geometry))?;
        let shape = Shape::parse(&roi.geometry).map_err(|source| RoiRefusal::Geometry {
            name: name.to_string(),
            source,
        })?;
        let geometry = shape.to_json();
        self.check_row_bytes(name, size(&geometry))?;
        Ok(NewRoi {
            roi_id: (!id.is_empty()).then_some(id),
            record: StoredRoi {
                set_name,
                label: roi.label,
                shape: shape.kind().to_string(),
                geometry,
                plane: roi.plane,
                props_json: roi.props_json,
                drawn_against_version: roi.drawn_against_version,
                rev: roi.rev,
                created_ms: 0,
                updated_ms: 0,
            },
        })
    }

    /// Refuses annotation `name` when its stored text would be `bytes`, over the row limit.
    fn check_row_bytes(&self, name: &str, bytes: usize) -> Result<(), RoiError> {
        if bytes > self.limits.max_row_bytes {
            return Err(RoiRefusal::RowTooLarge {
                name: name.to_string(),
                bytes,
                max: self.limits.max_row_bytes,
            }
            .into());
        }
        Ok(())
    }

    /// Creates or updates `rows` on served tensor `array_id` (named `asked` by the client,
    /// served from `source_url`) in one durable transaction. The batch is checked whole
    /// first: one bad annotation refuses all of it.
    pub fn put(
        &self,
        array_id: &str,
        asked: &str,
        source_url: &str,
        rows: Vec<IncomingRoi>,
        check_rev: bool,
    ) -> Result<RoiPutResult, RoiError> {
        let mut prepared = Vec::with_capacity(rows.len());
        let mut ids = HashSet::new();
        for roi in rows {
            let row = self.prepare(array_id, asked, roi)?;
            if let Some(id) = &row.roi_id
                && !ids.insert(id.clone())
            {
                return Err(RoiRefusal::DuplicateId { id: id.clone() }.into());
            }
            prepared.push(row);
        }
        let mut minted = Ok(());
        let batch = Batch {
            array_id,
            source_url,
            rows: prepared,
            check_rev,
        };
        let outcome =
            self.store.put(
                batch,
                self.limits.max_rois_per_tensor,
                now_ms(),
                || match mint_id() {
                    Ok(id) => id,
                    Err(e) => {
                        minted = Err(e);
                        String::new()
                    }
                },
            );
        minted?;
        let outcome = outcome?;
        Ok(RoiPutResult {
            stored: outcome
                .stored
                .iter()
                .map(|(id, r)| to_proto(array_id, id, r))
                .collect(),
            conflicts: outcome
                .conflicts
                .into_iter()
                .map(|(roi_id, stored_rev)| RoiConflict { roi_id, stored_rev })
                .collect(),
        })
    }

    /// The annotations of `array_id` (one set, or every client-owned one).
    pub fn list(&self, array_id: &str, set_name: &str) -> Result<Listing, RoiError> {
        let limit = usize::try_from(self.limits.max_rois_per_tensor).unwrap_or(usize::MAX);
        Ok(self.store.list(array_id, set_name, limit)?)
    }

    /// Deletes annotations of `array_id`: `ids`, else set `set_name`, else every
    /// client-owned one. Answers the ids removed.
    pub fn delete(
        &self,
        array_id: &str,
        ids: &[String],
        set_name: &str,
    ) -> Result<Vec<String>, RoiError> {
        if set_name.starts_with(RESERVED_SET_PREFIX) {
            return Err(RoiRefusal::ReservedSetDelete {
                set_name: set_name.to_string(),
            }
            .into());
        }
        Ok(self.store.delete(array_id, ids, set_name)?)
    }

    /// Reports (and with `apply` deletes) annotations whose tensor has not been served for
    /// `unseen_days`; `served` answers the source url of a tensor served now.
    pub fn prune(
        &self,
        unseen_days: i32,
        apply: bool,
        served: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PruneOutcome, RoiError> {
        if unseen_days <= 0 {
            return Err(RoiRefusal::UnseenDays { unseen_days }.into());
        }
        let now = now_ms();
        let cutoff = now - i64::from(unseen_days) * 86_400_000;
        Ok(self.store.prune(cutoff, now, apply, served)?)
    }

    /// Notes every annotated tensor served now (`served` answers its source url) as seen,
    /// so a later prune dates its absence from here; answers how many.
    pub fn stamp_served(&self, served: &dyn Fn(&str) -> Option<String>) -> Result<usize, RoiError> {
        Ok(self.store.stamp_served(now_ms(), served)?)
    }

    /// A grant to read `array_id` at content version `version`.
    pub fn grant(&self, array_id: &str, version: &[u8]) -> RoiGrant {
        self.sealer.grant(array_id, version, now_secs())
    }

    /// Whether `grant` lets its holder read `array_id`, whose content version is `current`
    /// (`None`: not served).
    pub fn check_grant(
        &self,
        array_id: &str,
        grant: &RoiGrant,
        current: Option<&[u8]>,
    ) -> Result<(), RoiError> {
        Ok(self.sealer.check(array_id, grant, current, now_secs())?)
    }

    /// How many annotations are stored, over every tensor.
    pub fn count(&self) -> Result<u64, RoiError> {
        Ok(self.store.count()?)
    }

    /// The stored annotations after key `(array_id, roi_id)` `after`, as
    /// `(array_id, roi_id, record)` in key order: [`RoiDb::page`].
    pub fn page(
        &self,
        after: Option<&(String, String)>,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<Vec<(String, String, StoredRoi)>, RoiError> {
        Ok(self.store.page(after, max_rows, max_bytes)?)
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A stored annotation as the protobuf a `RoiPutResult` carries.
fn to_proto(array_id: &str, roi_id: &str, r: &StoredRoi) -> RoiAnnotation {
    RoiAnnotation {
        roi_id: roi_id.to_string(),
        array_id: array_id.to_string(),
        set_name: r.set_name.clone(),
        label: r.label.clone(),
        // Stored geometry was checked when written.
        roi: Shape::parse(&r.geometry).ok().map(|s| s.to_proto()),
        props_json: r.props_json.clone(),
        drawn_against_version: r.drawn_against_version.clone(),
        rev: r.rev,
        created_at_unix_ms: r.created_ms,
        updated_at_unix_ms: r.updated_ms,
        plane: r.plane.iter().map(|(k, v)| (*k, *v)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incoming(id: &str, geometry: &str) -> IncomingRoi {
        IncomingRoi {
            roi_id: id.to_string(),
            geometry: geometry.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn a_batch_is_checked_whole_before_anything_is_written()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let rois = Annotations::open(
            dir.path(),
            RoiLimits {
                max_row_bytes: 200,
                ..Default::default()
            },
            None,
        )?;
        let point = r#"{"point": {"x": 1}}"#;
        let put = |rows| rois.put("img", "img", "file:///img.npy", rows, false);
        let refusal = |rows| put(rows).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            refusal(vec![incoming("", point), incoming("b", r#"{"mask": {}}"#)])
                .contains("'mask' is not stored")
        );
        assert!(
            refusal(vec![incoming("a", point), incoming("a", point)]).contains("appears twice")
        );
        assert!(refusal(vec![incoming("a,b", point)]).contains("comma"));
        let mut reserved = incoming("", point);
        reserved.set_name = "@ome".to_string();
        assert!(refusal(vec![reserved]).contains("reserved"));
        let mut big = incoming("", point);
        big.props_json = "x".repeat(300);
        assert!(refusal(vec![big]).contains("max_roi_bytes"));
        // The size is checked before the geometry is parsed: an oversized text is refused
        // for its size, never handed to the JSON parser.
        assert!(refusal(vec![incoming("", &"[".repeat(300))]).contains("max_roi_bytes"));
        let mut elsewhere = incoming("", point);
        elsewhere.array_id = "other".to_string();
        assert!(refusal(vec![elsewhere]).contains("does not match"));
        assert!(rois.list("img", "")?.rois.is_empty());

        let done = put(vec![incoming("", point), incoming("named", point)])?;
        assert_eq!(done.stored.len(), 2);
        let minted = &done.stored[0].roi_id;
        assert_eq!(minted.len(), 32);
        assert_eq!(minted.as_bytes()[12], b'4');
        assert_eq!(done.stored[1].set_name, DEFAULT_SET);
        assert!(done.stored[1].roi.is_some());
        assert!(rois.delete("img", &[], "@ome").is_err());
        Ok(())
    }
}

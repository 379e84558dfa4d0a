//! The local-disk gate: classifies the filesystem holding the cache directory.
//!
//! A network filesystem cannot keep the "never truncated while mapped" promise across hosts,
//! so the store refuses one unless the operator overrides. Classification uses the statfs
//! `f_type` magic and, for FUSE or unknown magics, the fstype in `/proc/self/mountinfo`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How a filesystem is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsClass {
    /// A local filesystem (or one not known to be remote).
    Local,
    /// A network, cluster or unknown FUSE filesystem, with the name that identified it.
    Network(String),
}

/// statfs magics of filesystems that are remote by nature.
const NETWORK_MAGICS: &[(u32, &str)] = &[
    (0x6969, "nfs"),
    (0x517B, "smb"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x00C3_6400, "ceph"),
    (0x0102_1997, "9p"),
    (0x0BD0_0BD0, "lustre"),
    (0x4750_4653, "gpfs"),
    (0x5346_414F, "afs"),
    (0x6B41_4653, "kafs"),
    (0x1983_0326, "beegfs"),
    (0x7375_7245, "coda"),
    (0x564C, "ncpfs"),
    (0x0116_1970, "gfs2"),
    (0x7461_636F, "ocfs2"),
];

/// statfs magic of FUSE; the mountinfo fstype/subtype decides.
const FUSE_MAGIC: u32 = 0x6573_5546;

/// mountinfo fstypes (or their prefix before a `.`) that are remote.
const NETWORK_FSTYPES: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb",
    "smb2",
    "smb3",
    "smbfs",
    "9p",
    "ceph",
    "lustre",
    "gpfs",
    "afs",
    "openafs",
    "beegfs",
    "glusterfs",
    "coda",
    "ncpfs",
    "gfs2",
    "ocfs2",
    "orangefs",
    "pvfs2",
    "davfs",
    "fhgfs",
];

/// FUSE subtypes that are remote.
const NETWORK_FUSE: &[&str] = &[
    "sshfs",
    "glusterfs",
    "ceph-fuse",
    "cephfs",
    "s3fs",
    "rclone",
    "gcsfuse",
    "goofys",
    "juicefs",
    "beegfs",
    "lustre",
    "davfs",
    "curlftpfs",
    "blobfuse",
    "blobfuse2",
    "mountpoint-s3",
    "moosefs",
    "mfs",
    "lizardfs",
    "seaweedfs",
    "alluxio-fuse",
    "gvfsd-fuse",
];

/// FUSE subtypes that are known to be local.
const LOCAL_FUSE: &[&str] = &[
    "lxcfs",
    "bindfs",
    "mergerfs",
    "fuse-overlayfs",
    "squashfuse",
    "ntfs-3g",
    "ntfs",
    "exfat",
    "gocryptfs",
    "encfs",
    "portal",
    "snapfuse",
];

/// Classifies a filesystem from its statfs `f_type` and, when known, the fstype field of its
/// mountinfo line (e.g. `nfs4`, `fuse.sshfs`, `fuseblk`).
pub fn classify(f_type: u32, mount_fstype: Option<&str>) -> FsClass {
    if let Some((_, name)) = NETWORK_MAGICS.iter().find(|(m, _)| *m == f_type) {
        return FsClass::Network((*name).to_string());
    }
    match mount_fstype {
        Some(fstype) => classify_fstype(fstype, f_type == FUSE_MAGIC),
        None if f_type == FUSE_MAGIC => {
            FsClass::Network("fuse (unknown subtype, may be remote)".to_string())
        }
        None => FsClass::Local,
    }
}

fn classify_fstype(fstype: &str, is_fuse_magic: bool) -> FsClass {
    let (main, sub) = match fstype.split_once('.') {
        Some((main, sub)) => (main, Some(sub)),
        None => (fstype, None),
    };
    if NETWORK_FSTYPES.contains(&main) {
        return FsClass::Network(fstype.to_string());
    }
    let fuse_like = is_fuse_magic || main == "fuse" || main == "fuseblk";
    if !fuse_like {
        return FsClass::Local;
    }
    if main == "fuseblk" {
        // A FUSE driver for a local block device (ntfs-3g, exfat).
        return FsClass::Local;
    }
    match sub {
        Some(sub) if NETWORK_FUSE.contains(&sub) => FsClass::Network(fstype.to_string()),
        Some(sub) if LOCAL_FUSE.contains(&sub) => FsClass::Local,
        _ => FsClass::Network(format!("{fstype} (unknown FUSE filesystem, may be remote)")),
    }
}

/// One parsed `/proc/self/mountinfo` line (only the fields the gate needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Device major number.
    pub major: u32,
    /// Device minor number.
    pub minor: u32,
    /// Mount point (octal escapes left as is).
    pub mount_point: String,
    /// Filesystem type, e.g. `ext4`, `nfs4`, `fuse.sshfs`.
    pub fstype: String,
}

/// Parses one mountinfo line:
/// `id parent major:minor root mount_point options [optional fields...] - fstype source super_options`.
pub fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let (left, right) = line.split_once(" - ")?;
    let mut fields = left.split_ascii_whitespace();
    let _id = fields.next()?;
    let _parent = fields.next()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let _root = fields.next()?;
    let mount_point = fields.next()?.to_string();
    let fstype = right.split_ascii_whitespace().next()?.to_string();
    Some(MountInfo {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mount_point,
        fstype,
    })
}

/// Finds the fstype of the mount with device `major:minor` in mountinfo text (the last such
/// line wins, as later mounts shadow earlier ones).
pub fn fstype_for_device(mountinfo: &str, major: u32, minor: u32) -> Option<String> {
    mountinfo
        .lines()
        .rev()
        .filter_map(parse_mountinfo_line)
        .find(|m| m.major == major && m.minor == minor)
        .map(|m| m.fstype)
}

/// Classifies the filesystem holding `dir` (which must exist).
pub fn classify_dir(dir: &Path) -> std::io::Result<FsClass> {
    let stat = rustix::fs::statfs(dir)?;
    // f_type is a signed word; the magics are 32-bit values.
    let f_type = (stat.f_type as u64 & 0xFFFF_FFFF) as u32;
    let dev = std::fs::metadata(dir)?.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let fstype = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|text| fstype_for_device(&text, major, minor));
    Ok(classify(f_type, fstype.as_deref()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn mountinfo_line_with_optional_fields() {
        let line = "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue";
        let m = parse_mountinfo_line(line).unwrap();
        assert_eq!((m.major, m.minor), (98, 0));
        assert_eq!(m.mount_point, "/mnt/parent");
        assert_eq!(m.fstype, "ext3");
        assert!(parse_mountinfo_line("garbage").is_none());
        assert!(parse_mountinfo_line("1 2 x:y / / rw - ext4 a b").is_none());
    }

    #[test]
    fn later_mount_on_same_device_wins() {
        let text = "1 0 0:50 / /a rw - tmpfs tmpfs rw\n2 0 0:51 / /b rw - fuse.sshfs u@h: rw\n3 0 0:50 / /c rw - nfs4 h:/x rw\n";
        assert_eq!(
            fstype_for_device(text, 0, 51).as_deref(),
            Some("fuse.sshfs")
        );
        assert_eq!(fstype_for_device(text, 0, 50).as_deref(), Some("nfs4"));
        assert_eq!(fstype_for_device(text, 9, 9), None);
    }
}

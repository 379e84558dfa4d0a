//! The local-disk gate: network and unknown FUSE filesystems are classified as network (and
//! refused by `Store::open` unless overridden); local ones pass. No network filesystem can be
//! mounted in CI, so the classification is checked on table inputs and real mountinfo text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_segments::fsgate::{FsClass, classify, classify_dir, fstype_for_device};
use tessera_segments::{Store, StoreOptions};

const EXT4: u32 = 0xEF53;
const TMPFS: u32 = 0x0102_1994;
const XFS: u32 = 0x5846_5342;
const BTRFS: u32 = 0x9123_683E;
const OVERLAY: u32 = 0x794C_7630;
const FUSE: u32 = 0x6573_5546;

fn is_network(c: &FsClass) -> bool {
    matches!(c, FsClass::Network(_))
}

#[test]
fn network_magics_are_refused() {
    for (magic, name) in [
        (0x6969, "nfs"),
        (0x517B, "smb"),
        (0xFF53_4D42, "cifs"),
        (0xFE53_4D42, "smb2"),
        (0x00C3_6400, "ceph"),
        (0x0102_1997, "9p"),
        (0x0BD0_0BD0, "lustre"),
        (0x4750_4653, "gpfs"),
        (0x5346_414F, "afs"),
        (0x1983_0326, "beegfs"),
    ] {
        assert_eq!(
            classify(magic, None),
            FsClass::Network(name.to_string()),
            "{magic:#x}"
        );
        // The magic wins even if mountinfo was not found or says something else.
        assert!(is_network(&classify(magic, Some("ext4"))), "{magic:#x}");
    }
}

#[test]
fn local_magics_pass() {
    for magic in [EXT4, TMPFS, XFS, BTRFS, OVERLAY] {
        assert_eq!(classify(magic, None), FsClass::Local, "{magic:#x}");
    }
    assert_eq!(classify(EXT4, Some("ext4")), FsClass::Local);
    assert_eq!(classify(OVERLAY, Some("overlay")), FsClass::Local);
}

#[test]
fn fuse_is_decided_by_subtype() {
    for fstype in [
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.ceph-fuse",
    ] {
        assert!(is_network(&classify(FUSE, Some(fstype))), "{fstype}");
    }
    for fstype in [
        "fuse.lxcfs",
        "fuseblk",
        "fuse.mergerfs",
        "fuse.fuse-overlayfs",
    ] {
        assert_eq!(classify(FUSE, Some(fstype)), FsClass::Local, "{fstype}");
    }
    // Unknown FUSE: could be remote, so refused by default.
    assert!(is_network(&classify(FUSE, Some("fuse.somethingnew"))));
    assert!(is_network(&classify(FUSE, Some("fuse"))));
    assert!(is_network(&classify(FUSE, None)));
}

#[test]
fn mountinfo_fstype_catches_unknown_magics() {
    // A network filesystem whose magic is not in the table is still caught by mountinfo.
    for fstype in [
        "nfs4",
        "cifs",
        "smb3",
        "glusterfs",
        "beegfs",
        "lustre",
        "gpfs",
        "afs",
    ] {
        assert!(is_network(&classify(0x1234_5678, Some(fstype))), "{fstype}");
    }
    let mountinfo = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:44 / /mnt/data rw,relatime shared:20 - nfs4 server:/export rw,vers=4.2
41 22 0:45 / /home/u/remote rw,nosuid shared:21 - fuse.sshfs u@host:/ rw,user_id=0
";
    let nfs = fstype_for_device(mountinfo, 0, 44).unwrap();
    assert!(is_network(&classify(0x1234_5678, Some(&nfs))));
    let sshfs = fstype_for_device(mountinfo, 0, 45).unwrap();
    assert!(is_network(&classify(FUSE, Some(&sshfs))));
    let root = fstype_for_device(mountinfo, 8, 1).unwrap();
    assert_eq!(classify(EXT4, Some(&root)), FsClass::Local);
}

#[test]
fn local_directory_opens() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(classify_dir(tmp.path()).unwrap(), FsClass::Local);
    Store::open(StoreOptions::new(tmp.path())).unwrap();
}

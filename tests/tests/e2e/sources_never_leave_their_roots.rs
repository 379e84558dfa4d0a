//! A source's file is judged where it really is on every open, not only when it was found
//! (issue 28, item 3). After `add_source(inbox)`, a link retargeted out of the roots and a
//! directory replaced by a link out of them are refused on the next read, never served; a
//! configured folder is held the same way (`follow_links_outside = false`, the default).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use arrow_flight::Action;
use arrow_flight::FlightClient;
use futures::TryStreamExt;
use prost::Message;
use tessera_e2e::*;
use tessera_proto::consts::ACTION_ADD_SOURCE;
use tessera_proto::pb::add_source_stream_message::Payload;
use tessera_proto::pb::{AddSourceRequest, AddSourceResult, AddSourceStreamMessage};

/// `add_source(url)`: its final result.
pub(crate) async fn add_source(client: &mut FlightClient, url: &Path) -> AddSourceResult {
    let body = AddSourceRequest {
        url: url.display().to_string(),
        ..Default::default()
    }
    .encode_to_vec();
    let replies: Vec<bytes::Bytes> = client
        .do_action(Action::new(ACTION_ADD_SOURCE, body))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let last = AddSourceStreamMessage::decode(replies.last().unwrap().clone()).unwrap();
    match last.payload {
        Some(Payload::Result(result)) => result,
        other => panic!("add_source ended with {other:?}"),
    }
}

/// The bytes of a whole read of `array_id` (one chunk), or the status refusing it.
pub(crate) async fn read_all(
    client: &mut FlightClient,
    array_id: &str,
) -> Result<Vec<u8>, tonic::Status> {
    let info = client
        .get_flight_info(read_descriptor(array_id, None))
        .await
        .map_err(status_of)?;
    let mut out = Vec::new();
    for (_, _, ticket) in endpoint_bounds(&info) {
        let batches: Vec<_> = client
            .do_get(ticket)
            .await
            .map_err(status_of)?
            .try_collect()
            .await
            .map_err(status_of)?;
        out.extend(chunk_parts(&batches[0]).0);
    }
    Ok(out)
}

/// Reads `array_id` and asserts it is refused as lying outside, never served.
async fn assert_refused_outside(client: &mut FlightClient, array_id: &str, secret: &Path) {
    match read_all(client, array_id).await {
        Ok(bytes) => panic!("{array_id} served {bytes:?} from outside its roots"),
        Err(status) => {
            assert!(
                status.message().contains("resolves outside"),
                "{array_id}: {status:?}"
            );
            let secret = secret.display().to_string();
            assert!(!status.message().contains(&secret), "{status:?}");
        }
    }
}

#[tokio::test]
async fn links_retargeted_out_of_the_roots_are_refused_on_the_next_read() {
    let tmp = tempfile::tempdir().unwrap();
    let inbox = tmp.path().join("inbox");
    let private = tmp.path().join("private");
    let served = tmp.path().join("served");
    for dir in [&inbox.join("sub"), &private, &served] {
        std::fs::create_dir_all(dir).unwrap();
    }
    write_npy(&private.join("secret.npy"), "|u1", &[4], &[9, 9, 9, 9]);
    write_npy(&private.join("b.npy"), "|u1", &[4], &[8, 8, 8, 8]);
    write_npy(&inbox.join("a.npy"), "|u1", &[4], &[1, 2, 3, 4]);
    write_npy(&inbox.join("sub/b.npy"), "|u1", &[4], &[5, 6, 7, 8]);
    std::os::unix::fs::symlink(inbox.join("a.npy"), inbox.join("link.npy")).unwrap();
    write_npy(&served.join("own.npy"), "|u1", &[4], &[3, 3, 3, 3]);
    std::os::unix::fs::symlink(served.join("own.npy"), served.join("door.npy")).unwrap();

    let root = inbox.clone();
    let server = TestServer::start_with(vec![served.clone()], move |config| {
        config.sources.add_source_roots = vec![root];
        config.chunks.settle_window = std::time::Duration::ZERO.into();
    })
    .await;
    let mut client = server.client().await;
    let added = add_source(&mut client, &inbox).await;
    let mut ids = added.added.clone();
    ids.sort();
    assert_eq!(ids, ["inbox.a", "inbox.link", "inbox.sub.b"], "{added:?}");
    assert_eq!(
        read_all(&mut client, "inbox.link").await.unwrap(),
        [1, 2, 3, 4]
    );
    assert_eq!(
        read_all(&mut client, "inbox.sub.b").await.unwrap(),
        [5, 6, 7, 8]
    );
    assert_eq!(read_all(&mut client, "door").await.unwrap(), [3, 3, 3, 3]);

    // The link now leads out of the root: refused, not served.
    std::fs::remove_file(inbox.join("link.npy")).unwrap();
    std::os::unix::fs::symlink(private.join("secret.npy"), inbox.join("link.npy")).unwrap();
    assert_refused_outside(&mut client, "inbox.link", &private).await;

    // The folder is now a link out of the root: refused too.
    std::fs::rename(inbox.join("sub"), tmp.path().join("old-sub")).unwrap();
    std::os::unix::fs::symlink(&private, inbox.join("sub")).unwrap();
    assert_refused_outside(&mut client, "inbox.sub.b", &private).await;

    // A configured folder's link retargeted out of it, likewise.
    std::fs::remove_file(served.join("door.npy")).unwrap();
    std::os::unix::fs::symlink(private.join("secret.npy"), served.join("door.npy")).unwrap();
    assert_refused_outside(&mut client, "door", &private).await;

    // What stays inside still serves.
    assert_eq!(
        read_all(&mut client, "inbox.a").await.unwrap(),
        [1, 2, 3, 4]
    );
    assert_eq!(read_all(&mut client, "own").await.unwrap(), [3, 3, 3, 3]);
}

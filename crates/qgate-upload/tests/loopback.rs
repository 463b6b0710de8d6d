//! The two-ended upload against the real `qgate server` on loopback: two lanes bound to two
//! local addresses (127.0.0.1 and 127.0.0.2), the file checked byte for byte on disk.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_chunks::{FileInfo, Layout};
use qgate_server::{RunningServer, Server, UploadLimits, Uploads};
use qgate_transport::{DevPki, Socket};
use qgate_upload::{sha256, Lane, Upload, UploadError};

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-uploadtest-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn data(n: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<_>>()
        .into()
}

fn start(pki: &DevPki, root: &std::path::Path) -> RunningServer {
    Server::builder()
        .socket(Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap())
        .identity(&pki.server)
        .uploads(Uploads::new(root, UploadLimits::default()).unwrap())
        .start()
        .unwrap()
}

fn lane(local: &str, server: SocketAddr) -> Lane {
    Lane {
        socket: Socket::bind_udp(format!("{local}:0").parse().unwrap()).unwrap(),
        server,
        backup: None,
    }
}

fn info(bytes: &Bytes, chunk: u64) -> FileInfo {
    FileInfo {
        layout: Layout::new(bytes.len() as u64, chunk).unwrap(),
        sha256: sha256(bytes, bytes.len() as u64, |_| {}).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lanes_upload_a_file_from_both_ends() {
    let pki = DevPki::generate(&[]).unwrap();
    let root = dir("two");
    let server = start(&pki, &root);
    let file = data(3_000_000 + 123, 1);
    let up = Upload::builder()
        .lane(lane("127.0.0.1", server.addr()))
        .lane(lane("127.0.0.2", server.addr()))
        .trust(pki.trust())
        .name("two.bin")
        .file(info(&file, 64 * 1024), Arc::new(file.clone()));
    let progress = up.progress();
    let report = up.run().await.unwrap();
    assert_eq!(std::fs::read(root.join("two.bin")).unwrap(), &file[..]);
    let chunks: u64 = report.lanes.iter().map(|l| l.chunks).sum();
    assert_eq!(chunks, 46, "every chunk counted once: {report:?}");
    assert!(
        report.lanes.iter().all(|l| l.chunks > 0),
        "both lanes worked: {report:?}"
    );
    assert_eq!(progress.bytes(), file.len() as u64);
    let s = server.stats.snapshot();
    assert_eq!((s.upload_chunks, s.uploads_completed), (46, 1));
    server.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_upload_resumes_without_resending_what_the_server_holds() {
    let pki = DevPki::generate(&[]).unwrap();
    let root = dir("resume");
    let file = data(1_000_000, 2);
    let inf = info(&file, 16 * 1024);
    // The first attempt got chunks 0-9 and the last 5 onto the server's disk.
    {
        let u = Uploads::new(&root, UploadLimits::default()).unwrap();
        let n = inf.layout.chunks();
        for i in (0..10).chain(n - 5..n) {
            let (off, len) = inf.layout.range(i).unwrap();
            u.put(
                std::net::Ipv4Addr::LOCALHOST.into(),
                "r.bin",
                &inf,
                i,
                &file[off as usize..off as usize + len],
            )
            .unwrap();
        }
        u.announce(std::net::Ipv4Addr::LOCALHOST.into(), "r.bin", &inf)
            .unwrap();
    }
    let server = start(&pki, &root);
    let report = Upload::builder()
        .lane(lane("127.0.0.1", server.addr()))
        .lane(lane("127.0.0.2", server.addr()))
        .trust(pki.trust())
        .name("r.bin")
        .file(inf, Arc::new(file.clone()))
        .run()
        .await
        .unwrap();
    assert_eq!(std::fs::read(root.join("r.bin")).unwrap(), &file[..]);
    let n = inf.layout.chunks() as u64;
    let last = inf.layout.range(n as usize - 1).unwrap().1 as u64;
    assert_eq!(report.resumed_bytes, 14 * 16 * 1024 + last);
    assert_eq!(server.stats.snapshot().upload_chunks, n - 15, "{report:?}");
    // Again: the server says it is complete; nothing is sent.
    let report = Upload::builder()
        .lane(lane("127.0.0.1", server.addr()))
        .trust(pki.trust())
        .name("r.bin")
        .file(inf, Arc::new(file.clone()))
        .run()
        .await
        .unwrap();
    assert_eq!(report.lanes[0].chunks, 0);
    server.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_interface_leaves_the_whole_file_to_the_other() {
    let pki = DevPki::generate(&[]).unwrap();
    let root = dir("dead");
    let server = start(&pki, &root);
    let file = data(500_000, 3);
    // Lane 2 points at a port where nothing answers.
    let nowhere: SocketAddr = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let report = Upload::builder()
        .lane(lane("127.0.0.1", server.addr()))
        .lane(lane("127.0.0.2", nowhere))
        .trust(pki.trust())
        .request_timeout(Duration::from_secs(1))
        .name("d.bin")
        .file(info(&file, 16 * 1024), Arc::new(file.clone()))
        .run()
        .await
        .unwrap();
    assert_eq!(std::fs::read(root.join("d.bin")).unwrap(), &file[..]);
    assert_eq!(report.lanes[1].chunks, 0);
    assert_eq!(report.lanes[0].chunks, 31);
    server.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_a_different_file_under_the_same_name() {
    let pki = DevPki::generate(&[]).unwrap();
    let root = dir("refuse");
    let server = start(&pki, &root);
    let a = data(100_000, 4);
    let b = data(100_000, 5);
    let run = |f: &Bytes| {
        Upload::builder()
            .lane(lane("127.0.0.1", server.addr()))
            .trust(pki.trust())
            .name("same")
            .file(info(f, 16 * 1024), Arc::new(f.clone()))
            .run()
    };
    run(&a).await.unwrap();
    match run(&b).await {
        Err(UploadError::Refused { status, message }) => {
            assert_eq!(status, http::StatusCode::CONFLICT);
            // Same size, other bytes: the message says which (not two equal sizes).
            assert!(
                message.contains("stored complete with other content")
                    && message.contains("the same size, SHA-256"),
                "{message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(std::fs::read(root.join("same")).unwrap(), &a[..]);
    // Nobody reachable at all: a clear error, not a hang.
    let nowhere: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let e = Upload::builder()
        .lane(lane("127.0.0.1", nowhere))
        .trust(pki.trust())
        .request_timeout(Duration::from_millis(500))
        .name("x")
        .file(info(&a, 16 * 1024), Arc::new(a.clone()))
        .run()
        .await
        .unwrap_err();
    assert!(matches!(e, UploadError::Unreachable(_)), "{e}");
    server.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(&root);
}

/// The server crashes mid-upload (no flush: what it had not synced is not reported held when
/// it comes back) and restarts on the same address: the running client reconnects, learns
/// which chunks the new server holds, sends the rest again, and the file is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_crash_mid_upload_loses_nothing_the_client_keeps_sending() {
    let pki = DevPki::generate(&[]).unwrap();
    let root = dir("crash");
    let first = start(&pki, &root);
    let addr = first.addr();
    // Twice the server's sync interval: the crash comes long before the file is whole.
    let file = data(16_000_000, 6);
    let up = Upload::builder()
        .lane(lane("127.0.0.1", addr))
        .lane(lane("127.0.0.2", addr))
        .trust(pki.trust())
        .request_timeout(Duration::from_secs(5))
        .name("c.bin")
        .file(info(&file, 16 * 1024), Arc::new(file.clone()));
    let progress = up.progress();
    let upload = tokio::spawn(up.run());
    while progress.bytes() < 500_000 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Crash: the accept loop and every connection go, nothing is flushed.
    first.task.abort();
    first.endpoint.close(0u32.into(), b"crash");
    drop(first);
    // The old socket is freed once its closing connections are gone (3 PTOs), which a loaded
    // machine can stretch past any fixed sleep: bind as soon as the address is free.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let socket = loop {
        match Socket::bind_udp(addr) {
            Ok(s) => break s,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{addr} still bound: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let second = Server::builder()
        .socket(socket)
        .identity(&pki.server)
        .uploads(Uploads::new(&root, UploadLimits::default()).unwrap())
        .start()
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(60), upload)
        .await
        .expect("the upload finishes")
        .unwrap()
        .unwrap();
    assert_eq!(std::fs::read(root.join("c.bin")).unwrap(), &file[..]);
    assert!(second.stats.snapshot().upload_chunks > 0, "{report:?}");
    second.shutdown(Duration::from_secs(1)).await;
    let _ = std::fs::remove_dir_all(&root);
}

//! Devices known by their certificates (issue 49 item 1, decision G30), on loopback UDP: with a
//! device CA, the gateway takes only devices whose certificate it signed, forwards each record
//! under the identity the certificate names (never a `qgate-device` the device sends), and a
//! device without a certificate, with another CA's, or with an expired one stores nothing.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use qgate_gateway::device::Device;
use qgate_gateway::gateway::{Gateway, GatewayConfig};
use qgate_server::ServerStats;
use qgate_transport::http3::{self, H3Client, Handler, ServeLimits, ALPN_H3};
use qgate_transport::pki::{self, Issued, Role, Validity};
use qgate_transport::token::{TokenKey, TokenSigner};
use qgate_transport::{
    client_config_with_identity, connect, endpoint, server_config, Connected, DevPki, Identity,
    Socket, TransportOptions, TrustRoots,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// The far end: answers every record 201 and keeps the `qgate-device` each came under.
#[derive(Default)]
struct Far {
    devices: Mutex<Vec<String>>,
}

impl Handler for Far {
    async fn handle(&self, req: Request<()>, _body: Bytes, _peer: SocketAddr) -> Response<Bytes> {
        if let Some(d) = req.headers().get("qgate-device") {
            self.devices
                .lock()
                .unwrap()
                .push(d.to_str().unwrap().to_owned());
        }
        Response::builder()
            .status(StatusCode::CREATED)
            .body(Bytes::new())
            .unwrap()
    }
}

struct Setup {
    gw: Arc<Gateway>,
    _running: qgate_gateway::builder::RunningGateway,
    addr: SocketAddr,
    far: Arc<Far>,
    pki: DevPki,
    ca: Issued,
}

fn identity(i: &Issued) -> Identity {
    Identity {
        chain: vec![CertificateDer::from_pem_slice(i.cert_pem.as_bytes()).unwrap()],
        key: rustls::pki_types::PrivateKeyDer::from_pem_slice(i.key_pem.as_bytes()).unwrap(),
    }
}

fn roots(i: &Issued) -> TrustRoots {
    TrustRoots {
        roots: vec![CertificateDer::from_pem_slice(i.cert_pem.as_bytes()).unwrap()],
    }
}

async fn setup() -> Setup {
    setup_with(true, None).await
}

/// [`setup`]; `authenticated`: the gateway takes devices by certificate; `tokens`: also by
/// token, checked with this key.
async fn setup_with(authenticated: bool, tokens: Option<TokenKey>) -> Setup {
    let pki = DevPki::generate(&[]).unwrap();
    let ca = pki::new_ca("fleet CA", Validity::days(30)).unwrap();
    let opts = TransportOptions::default();
    let far = Arc::new(Far::default());
    let ep = endpoint(
        Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
        Some(server_config(&pki.server, &[ALPN_H3], &opts).unwrap()),
        None,
    )
    .unwrap();
    let server = ep.local_addr().unwrap();
    let handler = far.clone();
    tokio::spawn(async move {
        while let Some(inc) = ep.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                if let Ok(c) = inc.await {
                    let stats = Arc::new(ServerStats::default());
                    tokio::spawn(qgate_server::answer_probes(c.clone(), stats));
                    let _ = http3::serve_connection(c, handler, ServeLimits::default()).await;
                }
            });
        }
    });
    let cfg = GatewayConfig {
        // Each record alone, with its headers, so the far end reads its device.
        batch_max_record: 0,
        ..Default::default()
    };
    let mut builder = Gateway::builder()
        .with_config(cfg)
        .with_transport(opts)
        .with_identity(pki.server.clone())
        .with_server_trust(pki.trust());
    if authenticated {
        builder = builder.with_device_ca(roots(&ca));
    }
    if let Some(key) = tokens {
        builder = builder.with_device_tokens(key);
    }
    let running = builder
        .with_device_socket(Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap())
        .with_path(
            Socket::bind_udp("127.0.0.2:0".parse().unwrap()).unwrap(),
            server,
        )
        .start()
        .unwrap();
    assert!(running.paths_measured(Duration::from_secs(10)).await);
    Setup {
        gw: running.gateway.clone(),
        addr: running.addr(),
        _running: running,
        far,
        pki,
        ca,
    }
}

/// A device's TLS client configuration, presenting `me` if given, and its own UDP endpoint:
/// its connections share the configuration's resumption tickets.
struct Client {
    cfg: quinn::ClientConfig,
    ep: quinn::Endpoint,
}

impl Client {
    fn new(s: &Setup, me: Option<&Identity>) -> Client {
        Client {
            cfg: client_config_with_identity(
                &s.pki.trust(),
                &[ALPN_H3],
                &TransportOptions::default(),
                me,
            )
            .unwrap(),
            ep: endpoint(
                Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
                None,
                None,
            )
            .unwrap(),
        }
    }

    /// A new connection to the gateway (resuming in 0-RTT if `zero_rtt` and it holds a
    /// ticket) and its HTTP/3 client; the error that ended it first.
    async fn connect(&self, s: &Setup, zero_rtt: bool) -> Result<(Connected, H3Client), String> {
        let c = connect(&self.ep, &self.cfg, s.addr, "localhost", zero_rtt)
            .await
            .map_err(|e| e.to_string())?;
        let h3 = H3Client::new(c.connection().clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok((c, h3))
    }
}

/// A device presenting `me` (or nothing): its registration's answer, or the error that ended
/// the connection first.
async fn try_device(s: &Setup, me: Option<&Identity>) -> Result<Device, String> {
    let (_, h3) = Client::new(s, me).connect(s, false).await?;
    Device::register(h3, true).await.map_err(|e| e.to_string())
}

/// Wait until the wall clock is a second past `t`: credentials end on whole seconds.
async fn sleep_past(t: SystemTime) {
    let left = t.duration_since(SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(left + Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_is_known_by_its_certificate_and_strangers_store_nothing() {
    let s = tokio::time::timeout(Duration::from_secs(30), setup())
        .await
        .unwrap();
    let dev = pki::issue(&s.ca, "sensor-17", Role::Client, Validity::days(1)).unwrap();

    // Its records reach the server under the name its certificate gives, whatever it says.
    let d = try_device(&s, Some(&identity(&dev))).await.unwrap();
    d.send("/ingest/t", Bytes::from_static(b"one"))
        .await
        .unwrap();
    assert_eq!(*s.far.devices.lock().unwrap(), ["sensor-17"]);

    // Strangers: no certificate, another CA's for the same name, an expired one.
    let rogue_ca = pki::new_ca("rogue CA", Validity::days(30)).unwrap();
    let rogue = pki::issue(&rogue_ca, "sensor-17", Role::Client, Validity::days(1)).unwrap();
    let now = SystemTime::now();
    let expired = pki::issue(
        &s.ca,
        "sensor-18",
        Role::Client,
        Validity {
            from: now - Duration::from_secs(86_400 * 2),
            until: now - Duration::from_secs(86_400),
        },
    )
    .unwrap();
    for (what, me) in [
        ("no certificate", None),
        ("another CA's certificate", Some(identity(&rogue))),
        ("an expired certificate", Some(identity(&expired))),
    ] {
        let r = tokio::time::timeout(Duration::from_secs(10), try_device(&s, me.as_ref()))
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
        match r {
            Err(e) => eprintln!("{what}: refused: {e}"),
            Ok(d) => {
                let sent = d.send("/ingest/t", Bytes::from_static(b"x")).await;
                assert!(sent.is_err(), "{what}: a record went through");
            }
        }
    }
    assert_eq!(
        *s.far.devices.lock().unwrap(),
        ["sensor-17"],
        "nothing of a stranger's reached the server"
    );
    assert_eq!(s.gw.stats.snapshot().forwarded, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_device_in_0rtt_keeps_the_identity_of_the_session_it_resumes() {
    let s = tokio::time::timeout(Duration::from_secs(30), setup())
        .await
        .unwrap();
    let dev = identity(&pki::issue(&s.ca, "meter-3", Role::Client, Validity::days(1)).unwrap());
    let client = Client::new(&s, Some(&dev));
    let (_, h3) = client.connect(&s, false).await.unwrap();
    let d = Device::register(h3, false).await.unwrap();
    d.send("/ingest/t", Bytes::from_static(b"first"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the ticket arrives
    let (c, h3) = client.connect(&s, true).await.unwrap();
    assert!(c.is_0rtt(), "the device resumes with 0-RTT");
    let h3 = Arc::new(h3);
    let d = Device::first_use(h3, false, [9; 32]);
    let id = d.next_request_id().unwrap();
    d.send_as("/ingest/t", Bytes::from_static(b"early"), Some(&id))
        .await
        .unwrap();
    assert_eq!(*s.far.devices.lock().unwrap(), ["meter-3", "meter-3"]);
    // On loopback the handshake may finish before the gateway reads the request; either way
    // it is taken, never told to wait.
    assert_eq!(s.gw.stats.snapshot().too_early, 0);
}

/// Bytes on the wire (both ways, UDP payloads) for a device to connect and register, as the
/// device counts them.
async fn registration_bytes(s: &Setup, me: Option<&Identity>) -> u64 {
    let (c, h3) = Client::new(s, me).connect(s, false).await.unwrap();
    let conn = c.connection().clone();
    Device::register(h3, true).await.unwrap();
    let st = conn.stats();
    st.udp_tx.bytes + st.udp_rx.bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_adds_at_most_1_5_kb_to_a_registration() {
    let open = tokio::time::timeout(Duration::from_secs(30), setup_with(false, None))
        .await
        .unwrap();
    let authed = tokio::time::timeout(Duration::from_secs(30), setup())
        .await
        .unwrap();
    let dev =
        identity(&pki::issue(&authed.ca, "sensor-42", Role::Client, Validity::days(1)).unwrap());
    // The least of five each, and of up to fifteen if a busy machine inflated every one of the
    // first: acknowledgements and probe timeouts add bytes by timing alone. Bytes, never time,
    // are compared.
    let (mut plain, mut with_cert) = (u64::MAX, u64::MAX);
    for _ in 0..3 {
        for _ in 0..5 {
            plain = plain.min(registration_bytes(&open, None).await);
            with_cert = with_cert.min(registration_bytes(&authed, Some(&dev)).await);
        }
        if with_cert <= plain + 1536 {
            break;
        }
    }
    eprintln!("registration: {plain} B without a certificate, {with_cert} B with one");
    assert!(
        with_cert <= plain + 1536,
        "{with_cert} B with a certificate against {plain} B without (issue 49: at most 1.5 KB more)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_without_a_certificate_is_known_by_its_token() {
    let (_, signer) = TokenSigner::generate().unwrap();
    let key = TokenKey::from_pem(&signer.public_pem()).unwrap();
    // Certificates or tokens: a certificate becomes optional.
    let s = tokio::time::timeout(Duration::from_secs(30), setup_with(true, Some(key)))
        .await
        .unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let device = |token: Option<String>| {
        let s = &s;
        async move {
            let (_, h3) = Client::new(s, None).connect(s, false).await.unwrap();
            match token {
                Some(t) => Device::register_with_token(h3, false, &t).await,
                None => Device::register(h3, false).await,
            }
        }
    };
    let d = device(Some(signer.token("tracker-5", now, 600)))
        .await
        .unwrap();
    d.send("/ingest/t", Bytes::from_static(b"by token"))
        .await
        .unwrap();
    // A certificate still works beside tokens.
    let dev = pki::issue(&s.ca, "sensor-9", Role::Client, Validity::days(1)).unwrap();
    try_device(&s, Some(&identity(&dev)))
        .await
        .unwrap()
        .send("/ingest/t", Bytes::from_static(b"by certificate"))
        .await
        .unwrap();
    assert_eq!(*s.far.devices.lock().unwrap(), ["tracker-5", "sensor-9"]);

    // No token, an expired one, another operator's, garbage: 401, nothing stored.
    let (_, other) = TokenSigner::generate().unwrap();
    for (what, token) in [
        ("no token", None),
        (
            "an expired token",
            Some(signer.token("tracker-5", now - 1200, 600)),
        ),
        (
            "another key's token",
            Some(other.token("tracker-5", now, 600)),
        ),
        ("garbage", Some("not.a.token".to_owned())),
    ] {
        match device(token).await {
            Err(qgate_gateway::device::DeviceError::Refused { status, body, .. }) => {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}")
            }
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: registered"),
        }
    }
    assert_eq!(s.far.devices.lock().unwrap().len(), 2);
    assert_eq!(s.gw.stats.snapshot().unauthenticated, 4);

    // A connection outliving its token: refused from the token's end on. Five seconds to
    // register and send first, however busy the machine.
    let issued = SystemTime::now();
    let secs = issued
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let d = device(Some(signer.token("tracker-6", secs, 5)))
        .await
        .unwrap();
    d.send("/ingest/t", Bytes::from_static(b"in time"))
        .await
        .unwrap();
    sleep_past(issued + Duration::from_secs(5)).await;
    match d.send("/ingest/t", Bytes::from_static(b"too late")).await {
        Err(qgate_gateway::device::DeviceError::Refused { status, .. }) => {
            assert_eq!(status, StatusCode::UNAUTHORIZED)
        }
        other => panic!("a request past the token's end: {other:?}"),
    }
    assert_eq!(s.far.devices.lock().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_does_not_outlive_its_certificate() {
    let s = tokio::time::timeout(Duration::from_secs(30), setup())
        .await
        .unwrap();
    let now = SystemTime::now();
    // Five seconds to register and send first, however busy the machine.
    let short = Validity {
        from: now - Duration::from_secs(3600),
        until: now + Duration::from_secs(5),
    };
    let dev = identity(&pki::issue(&s.ca, "meter-4", Role::Client, short).unwrap());
    let client = Client::new(&s, Some(&dev));
    let (_, h3) = client.connect(&s, false).await.unwrap();
    let d = Device::register(h3, false).await.unwrap();
    d.send("/ingest/t", Bytes::from_static(b"valid"))
        .await
        .unwrap();
    sleep_past(short.until).await;
    // TLS resumes the session without checking its certificate again; the gateway does.
    let (_, h3) = client.connect(&s, true).await.unwrap();
    match Device::register(h3, false).await {
        Err(qgate_gateway::device::DeviceError::Refused { status, body, .. }) => {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}")
        }
        Err(e) => eprintln!("refused in the handshake: {e}"),
        Ok(_) => panic!("a session resumed past its certificate's end registered"),
    }
    assert_eq!(*s.far.devices.lock().unwrap(), ["meter-4"]);
}

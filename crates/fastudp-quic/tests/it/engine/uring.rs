//! The engine receiving with io_uring ([`EngineConfig::uring`], feature
//! `uring`): every datagram read in place in the ring's provided buffers
//! and served byte-exact; and, where the kernel refuses io_uring (a
//! seccomp filter here, as in a container), the syscall path, counted and
//! reported.

use super::*;

/// A test that cannot run here: skipped with a message, or a failure
/// under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1` (CI).
fn skip(why: &str) {
    fastudp_test_support::skip(&fastudp_test_support::current_test(), why);
}

/// 16 requests at once on one connection and one of 4 MB, each answer
/// checked byte for byte; returns the bytes served.
fn fetch_and_check(engine: &Engine, cert: Cert) -> u64 {
    let addr = engine.local_addr();
    let rt = rt();
    let _in = rt.enter();
    let ep = client(cert, hq::ALPN, None);
    rt.block_on(async {
        let conn = connect(&ep, addr).await.unwrap();
        let sizes = (0..17u64).map(|i| if i == 16 { 4 << 20 } else { 10_000 + i * 7_919 });
        let total = fetch_bytes_at_once(&conn, sizes).await;
        // Waited for on the runtime, which must keep running: the client's
        // last ACKs, which complete the goodput, are sent by its tasks.
        let t = Instant::now() + Duration::from_secs(10);
        while engine.counters().app_bytes.load(Relaxed) != total {
            assert!(Instant::now() < t, "goodput not counted within 10 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        conn.close(0u32.into(), b"");
        total
    })
}

/// Two workers on rings: every datagram the server received was read in
/// place in a provided buffer (none through a receive batch), and every
/// byte of 17 answers arrived.
#[test]
fn hq_bytes_exact_from_the_ring() {
    if let Some(why) = fastudp_io::uring::probe().why_not() {
        return skip(&format!("io_uring unavailable: {why}"));
    }
    let (engine, cert) = start(Router::new().with(hq::ALPN, HqApp::default()), |c| {
        c.uring(true)
    });
    fetch_and_check(&engine, cert);
    let c = engine.counters().clone();
    assert_eq!(engine.uring_error(), None);
    assert_eq!(c.uring_fallbacks.load(Relaxed), 0);
    let (in_place, all) = (
        c.recv_in_place.load(Relaxed),
        c.datagrams_recv.load(Relaxed),
    );
    // The handshake, 17 requests and the ACKs of 4.3 MB: dozens.
    assert!(in_place > 20, "{in_place} datagrams read in place");
    assert_eq!(in_place, all, "a datagram was received outside the ring");
    stop(engine);
}

/// `io_uring_setup` refused with `EPERM` by a seccomp filter on the thread
/// that starts the engine (and so on its workers, which inherit it): the
/// sockets fall back to syscalls, each worker counts it, the engine says
/// why, and every byte is still served.
#[test]
fn a_refused_ring_falls_back_to_syscalls() {
    // The process-wide probe is made first, outside the filter, so that it
    // stays true for the other tests of this process: the refusal here is
    // the ring's own set-up, as when a filter comes after the probe.
    let _ = fastudp_io::uring::probe();
    let filtered = std::thread::spawn(|| {
        let filter = seccompiler::SeccompFilter::new(
            [(libc::SYS_io_uring_setup, vec![])].into_iter().collect(),
            seccompiler::SeccompAction::Allow,
            seccompiler::SeccompAction::Errno(libc::EPERM as u32),
            std::env::consts::ARCH
                .try_into()
                .map_err(|e| format!("{e:?}"))?,
        )
        .map_err(|e| e.to_string())?;
        let prog: seccompiler::BpfProgram = filter.try_into().map_err(|e| format!("{e:?}"))?;
        seccompiler::apply_filter(&prog).map_err(|e| format!("seccomp: {e}"))?;
        Ok::<_, String>(start(Router::new().with(hq::ALPN, HqApp::default()), |c| {
            c.uring(true)
        }))
    });
    let (engine, cert) = match filtered.join().unwrap() {
        Ok(e) => e,
        Err(why) => return skip(&format!("cannot install a seccomp filter: {why}")),
    };
    let served = fetch_and_check(&engine, cert);
    assert!(served > 4 << 20);
    let c = engine.counters().clone();
    assert_eq!(c.uring_fallbacks.load(Relaxed), 2, "both workers fell back");
    assert_eq!(c.recv_in_place.load(Relaxed), 0);
    assert!(c.datagrams_recv.load(Relaxed) > 20);
    let why = engine.uring_error().expect("the reason is reported");
    assert!(
        why.contains("io_uring") && why.contains("syscalls"),
        "reason: {why}"
    );
    stop(engine);
}

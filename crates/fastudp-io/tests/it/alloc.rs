//! After warm-up, the hot paths make no heap allocation: `send`, `recv`
//! (with GRO trains, which the tests check did arrive), `recv_slices`,
//! `Coalescer::push`/`flush`, and the zerocopy send and reap. A counting
//! global allocator proves it; the count is per thread, so the receiver
//! and the test harness do not disturb it. Under `FASTUDP_BACKEND=uring`
//! (.ci/run's io_uring pass) the same tests run the sockets on rings and
//! check that they did.

use crate::common;
use common::{skip, used_backend};
use fastudp_io::UdpIo;

use fastudp_io::{Coalescer, Config, RecvBatch, RecvMeta, Socket, Transmit, ZeroCopySender};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::IoSliceMut;
use std::time::Duration;

struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// thread-local counter allocates nothing (const-initialised Cell).
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Heap allocations this thread made while running `f`.
fn allocations(f: impl FnOnce()) -> u64 {
    let before = COUNT.with(|c| c.get());
    f();
    COUNT.with(|c| c.get()) - before
}

fn pair() -> (Socket, Socket) {
    let rx = common::bind_with(
        "127.0.0.1:0".parse().unwrap(),
        Config::default().recv_buffer(32 << 20),
    )
    .unwrap();
    rx.as_std()
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let tx = common::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (tx, rx)
}

#[test]
fn the_counter_counts() {
    // A test that can fail: the counter sees an allocation.
    assert!(allocations(|| drop(std::hint::black_box(vec![1u8; 10]))) >= 1);
}

/// Eight 10-datagram GSO trains and eight single datagrams to `dest`.
fn mixed<'a>(dest: std::net::SocketAddr, train: &'a [u8], single: &'a [u8]) -> Vec<Transmit<'a>> {
    (0..16)
        .map(|i| {
            if i % 2 == 0 {
                Transmit::train(dest, train, 1200)
            } else {
                Transmit::new(dest, single).with_ecn(Some(fastudp_io::EcnCodepoint::Ect0))
            }
        })
        .collect()
}

/// Datagrams of one round of [`mixed`].
const ROUND: usize = 8 * 10 + 8;

/// The receiver must get GRO trains (loopback passes GSO trains whole): a
/// test of the receive path that never saw one proved nothing about it.
/// A receiver without UDP GRO (an old kernel, or `Config::disabled` with `gro`)
/// tested only the plain path: that is a skip, said on standard error (a
/// failure under `FASTUDP_REQUIRE_PRIVILEGED_TESTS=1`). A GRO receiver
/// that got no train fails.
fn gro_happened(rx: &Socket, trains: usize) {
    if !rx.capabilities().supports(fastudp_io::Feature::Gro) {
        skip("the receiver has no UDP GRO: only the plain receive path was tested");
        return;
    }
    assert!(
        trains > 0,
        "the receiver has UDP GRO, but no message held more than one datagram: GRO never happened"
    );
}

#[test]
fn send_and_recv_allocate_nothing() {
    let (tx, rx) = pair();
    let dest = rx.as_std().local_addr().unwrap();
    let (train, single) = (vec![7u8; 10 * 1200], vec![8u8; 1200]);
    let ts = mixed(dest, &train, &single);
    let mut batch = RecvBatch::new(32);
    let mut trains = 0;
    let mut round = |batch: &mut RecvBatch| {
        assert!(tx.send(&ts).unwrap().all(ts.len()));
        let mut got = 0;
        while got < ROUND {
            rx.recv(batch).unwrap();
            got += batch.datagrams().count();
            trains += (&*batch)
                .into_iter()
                .filter(|(m, p)| m.datagrams(p).len() > 1)
                .count();
        }
    };
    round(&mut batch); // warm-up
    let n = allocations(|| {
        for _ in 0..50 {
            round(&mut batch);
        }
    });
    assert_eq!(n, 0, "send/recv allocated {n} times in 50 rounds");
    gro_happened(&rx, trains);
    used_backend(&tx, false);
    used_backend(&rx, true);
}

#[test]
fn recv_slices_allocates_nothing() {
    let (tx, rx) = pair();
    let dest = rx.as_std().local_addr().unwrap();
    let (train, single) = (vec![7u8; 10 * 1200], vec![8u8; 1200]);
    let ts = mixed(dest, &train, &single);
    // Room for a 64-datagram GRO train in each of 16 buffers.
    let mut store: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; 64 * 1500]).collect();
    let mut metas = vec![RecvMeta::default(); 16];
    let mut trains = 0;
    let mut round = |store: &mut Vec<Vec<u8>>, metas: &mut [RecvMeta]| {
        assert!(tx.send(&ts).unwrap().all(ts.len()));
        let mut got = 0;
        while got < ROUND {
            let mut bufs: [IoSliceMut<'_>; 16] = {
                let mut it = store.iter_mut();
                std::array::from_fn(|_| IoSliceMut::new(it.next().expect("16 buffers")))
            };
            let n = rx.recv_slices(&mut bufs, metas).unwrap();
            for (m, b) in metas[..n].iter().zip(&bufs) {
                assert!(!m.truncated);
                let count = m.datagrams(&b[..m.len]).len();
                got += count;
                trains += usize::from(count > 1);
            }
        }
        assert_eq!(got, ROUND);
    };
    round(&mut store, &mut metas); // warm-up
    let n = allocations(|| {
        for _ in 0..50 {
            round(&mut store, &mut metas);
        }
    });
    assert_eq!(n, 0, "recv_slices allocated {n} times in 50 rounds");
    gro_happened(&rx, trains);
    used_backend(&rx, true);
}

#[test]
fn coalescer_allocates_nothing() {
    let (tx, rx) = pair();
    let dest = rx.as_std().local_addr().unwrap();
    let mut c = Coalescer::new();
    let d = [5u8; 1200];
    let mut batch = RecvBatch::new(32);
    let round = |c: &mut Coalescer, batch: &mut RecvBatch| {
        for i in 0..100 {
            // Two destinations' worth of trains: a short one ends each.
            let len = if i % 25 == 24 { 600 } else { 1200 };
            c.push(&tx, dest, &d[..len], None, None).unwrap();
        }
        while c.queued().0 > 0 {
            c.flush(&tx).unwrap();
        }
        let mut got = 0;
        while got < 100 {
            rx.recv(batch).unwrap();
            got += batch.datagrams().count();
        }
    };
    round(&mut c, &mut batch);
    let n = allocations(|| {
        for _ in 0..50 {
            round(&mut c, &mut batch);
        }
    });
    assert_eq!(n, 0, "the coalescer allocated {n} times in 50 rounds");
    used_backend(&tx, false);
}

#[test]
fn zerocopy_send_and_reap_allocate_nothing() {
    let (tx, rx) = pair();
    if !tx.capabilities().supports(fastudp_io::Feature::Zerocopy) {
        skip("no MSG_ZEROCOPY");
        return;
    }
    let dest = rx.as_std().local_addr().unwrap();
    let mut zc = ZeroCopySender::new(&tx).unwrap().adaptive(false);
    let mut pool: Vec<Vec<u8>> = (0..64).map(|_| vec![3u8; 8 * 1200]).collect();
    let mut batch = RecvBatch::new(32);
    let round = |zc: &mut ZeroCopySender, pool: &mut Vec<Vec<u8>>, batch: &mut RecvBatch| {
        for _ in 0..16 {
            let b = pool.pop().expect("a free buffer");
            zc.send(&tx, dest, b, Some(1200), fastudp_io::SendMeta::default())
                .map_err(|(e, _)| e)
                .unwrap();
        }
        let mut got = 0;
        while got < 16 * 8 {
            rx.recv(batch).unwrap();
            got += batch.datagrams().count();
        }
        while zc.in_flight() > 0 {
            zc.reap(&tx).unwrap();
        }
        while let Some(b) = zc.pop_done() {
            pool.push(b);
        }
    };
    round(&mut zc, &mut pool, &mut batch);
    round(&mut zc, &mut pool, &mut batch);
    let n = allocations(|| {
        for _ in 0..30 {
            round(&mut zc, &mut pool, &mut batch);
        }
    });
    assert_eq!(n, 0, "zerocopy send/reap allocated {n} times in 30 rounds");
}

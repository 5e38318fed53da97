//! `fastudp tx -C` with `fastudp rx --server`: a test with both sides in
//! one summary, and a server that cannot be abused: its limits, one test
//! at a time, timeouts for idle and half-open clients, bounded reads, and
//! datagrams from other addresses not counted.

use crate::common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn fastudp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fastudp"))
        .args(args)
        .output()
        .expect("run fastudp")
}

/// A run that must have succeeded: its JSON, and its output for messages.
fn json_of(o: &std::process::Output) -> (serde_json::Value, String) {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (serde_json::from_str(&out).unwrap(), out)
}

/// A free TCP port on 127.0.0.1.
fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `fastudp rx --server` on a free control port with `extra`
/// options; returns it once it listens, and the port.
fn server(extra: &[&str]) -> (Running, String) {
    let port = free_tcp_port().to_string();
    let mut args = vec!["rx", "--server", "--control-port", &port];
    args.extend_from_slice(extra);
    let mut s = Running::start(&args);
    s.wait_for_line(|l| l.contains("serving tests"));
    (s, port)
}

fn connect(port: &str) -> TcpStream {
    let c = TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
    c.set_read_timeout(Some(STALL)).unwrap();
    c
}

/// The server's next line on `c`, or "" at end of stream.
fn reply(c: &TcpStream) -> String {
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line).unwrap_or(0);
    line
}

#[test]
fn a_test_prints_both_sides_and_json_has_the_server_and_intervals() {
    let (srv, port) = server(&["--max-tests", "1", "-G"]);
    let o = fastudp(&[
        "tx",
        "-D",
        "localhost",
        "-4",
        "-C",
        "--control-port",
        &port,
        "-l",
        "1",
        "-S",
        "1200",
        "-b",
        "100M",
        "-i",
        "0.5",
        "--json",
    ]);
    let (v, out) = json_of(&o);
    let sent = v["datagrams"].as_u64().unwrap();
    let got = v["server"]["datagrams"].as_u64().unwrap();
    assert!(sent > 0);
    assert_eq!(got + v["server"]["lost"].as_u64().unwrap(), sent, "{out}");
    assert!(v["server"]["jitter_ms"].as_f64().is_some());
    assert_eq!(v["server"]["foreign"], 0);
    // Paced at 100 Mbit/s: about 12.5 MB in the second (generous bounds:
    // the point is that -b limits the rate at all).
    let bytes = v["bytes"].as_u64().unwrap();
    assert!(bytes < 40_000_000, "-b 100M sent {bytes} bytes in 1 s");
    assert!(!v["intervals"].as_array().unwrap().is_empty(), "{out}");
    assert_eq!(v["schema"], 1);
    assert!(v["host"]["kernel"].as_str().is_some(), "{out}");
    assert_eq!(v["settings"]["rate_bits_per_sec"], 100_000_000u64);
    let e = srv.finish();
    assert!(e.status.success(), "{}", e.stderr);
    assert!(e.stdout.contains("test from 127.0.0.1"), "{}", e.stdout);
}

#[test]
fn tests_outside_the_servers_limits_are_refused() {
    let (_srv, port) = server(&["--max-duration", "2", "--max-rate", "100M"]);
    for (args, needle) in [
        (vec!["-l", "5", "-b", "10M"], "--max-duration"),
        (vec!["-l", "1"], "pace the test with -b"),
        (vec!["-l", "1", "-b", "1G"], "--max-rate"),
    ] {
        let mut a = vec!["tx", "-D", "127.0.0.1", "-C", "--control-port", &port];
        a.extend(args.iter());
        let o = fastudp(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        // The server's refusal is a runtime failure: the options are
        // good, this server does not take them.
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("fastudp: error: the server refused the test: ")
                && err.contains(needle)
                && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.5",
        "-b",
        "50M",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn one_test_at_a_time_and_the_rest_are_told_busy() {
    let (_srv, port) = server(&[]);
    let mut first = Running::start(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "4",
        "-b",
        "10M",
    ]);
    first.wait_for_line(|l| l.contains("Gbit/s"));
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "1",
        "-b",
        "10M",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("busy"), "{err}");
    let e = first.finish();
    assert!(e.status.success(), "{}", e.stderr);
}

#[test]
fn idle_half_open_and_oversized_clients_are_cut_off_and_the_server_goes_on() {
    let (_srv, port) = server(&[]);
    // Idle: says nothing; the server gives up after its request timeout.
    let idle = connect(&port);
    let start = Instant::now();
    let r = reply(&idle);
    assert!(r.contains("timed out"), "{r}");
    assert!(start.elapsed() < Duration::from_secs(30));
    // Oversized: a line with no end is cut at the bound.
    let mut big = connect(&port);
    let _ = big.write_all(&vec![b'x'; 100_000]);
    let r = reply(&big);
    assert!(r.contains("longer than"), "{r}");
    // Unknown fields (say, an address to send to) are refused.
    let mut odd = connect(&port);
    odd.write_all(
        b"{\"fastudp\":1,\"seconds\":1,\"rate\":null,\"mode\":\"x\",\"send_to\":\"192.0.2.1\"}\n",
    )
    .unwrap();
    let r = reply(&odd);
    assert!(r.contains("refused") && r.contains("malformed"), "{r}");
    // Half-open: asks for a test, then never reports; the server gives the
    // test up after its length plus the grace, and serves the next one.
    let mut half = connect(&port);
    half.write_all(b"{\"fastudp\":1,\"seconds\":0.5,\"rate\":null,\"mode\":\"x\"}\n")
        .unwrap();
    let r = reply(&half);
    assert!(r.contains("ready"), "{r}");
    let mut rest = Vec::new();
    let _ = half.read_to_end(&mut rest);
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.5",
        "-b",
        "10M",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn datagrams_from_another_address_are_not_counted() {
    let (_srv, port) = server(&["--max-tests", "1"]);
    // The control connection comes from 127.0.0.1, the data from 127.0.0.2.
    let mut c = connect(&port);
    c.write_all(b"{\"fastudp\":1,\"seconds\":0.5,\"rate\":1000000,\"mode\":\"x\"}\n")
        .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let data_port = v["data_port"].as_u64().expect("ready") as u16;
    let spoof = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
    let mut d = vec![0u8; 100];
    for seq in 0..100u64 {
        d[..8].copy_from_slice(&seq.to_le_bytes());
        spoof.send_to(&d, ("127.0.0.1", data_port)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    c.write_all(b"{\"datagrams\":0,\"bytes\":0}\n").unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["datagrams"], 0, "{line}");
    assert_eq!(v["foreign"], 100, "{line}");
}

/// With -B, the control connection comes from that address too, so the
/// data is the client's own and counted.
#[test]
fn bind_address_applies_to_the_control_connection_too() {
    let (_srv, port) = server(&["--max-tests", "1"]);
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.3",
        "-b",
        "10M",
        "-B",
        "127.0.0.2",
        "--json",
    ]);
    let (v, out) = json_of(&o);
    assert_eq!(v["server"]["foreign"], 0, "{out}");
    assert_eq!(
        v["server"]["datagrams"].as_u64().unwrap() + v["server"]["lost"].as_u64().unwrap(),
        v["datagrams"].as_u64().unwrap(),
        "{out}"
    );
}

/// A fake server that says every datagram was lost at the end (none
/// received, no gap): the client counts them lost, and it refuses a data
/// port of 0.
#[test]
fn datagrams_that_never_arrived_are_lost() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let data_port = sink.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        for reply in [
            format!("{{\"reply\":\"ready\",\"data_port\":{data_port}}}"),
            "{\"reply\":\"ready\",\"data_port\":0}".to_string(),
        ] {
            let (c, _) = l.accept().unwrap();
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut w = c;
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            writeln!(w, "{reply}").unwrap();
            if reply.contains("\"data_port\":0") {
                continue;
            }
            line.clear();
            r.read_line(&mut line).unwrap(); // Done
            writeln!(w, "{{\"datagrams\":0,\"bytes\":0,\"seconds\":0.0,\"lost\":0,\"duplicates\":0,\"reordered\":0,\"jitter_ms\":0.0,\"cpu_ns_per_byte\":0.0,\"calls\":0,\"messages\":0,\"foreign\":0}}").unwrap();
        }
    });
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.2",
        "-b",
        "10M",
        "--json",
    ]);
    let (v, out) = json_of(&o);
    assert!(v["datagrams"].as_u64().unwrap() > 0);
    assert_eq!(v["server"]["lost"], v["datagrams"], "{out}");
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("data port 0"), "{err}");
    fake.join().unwrap();
}

/// A client that trickles its request a byte at a time is cut off when
/// the request's whole time is up, not when a single read times out; a
/// rate of 0 is refused.
#[test]
fn a_trickling_client_is_cut_off_and_a_zero_rate_refused() {
    let (_srv, port) = server(&[]);
    let mut c = connect(&port);
    let start = Instant::now();
    let mut got = String::new();
    for b in b"{\"fastudp\":1,\"seconds\":1".iter() {
        if c.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(400));
        if start.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = BufReader::new(&c).read_line(&mut got);
    assert!(got.contains("timed out"), "{got}");
    assert!(start.elapsed() < Duration::from_secs(30));
    let mut z = connect(&port);
    z.write_all(b"{\"fastudp\":1,\"seconds\":1,\"rate\":0,\"mode\":\"x\"}\n")
        .unwrap();
    let r = reply(&z);
    assert!(r.contains("refused") && r.contains("rate of 0"), "{r}");
}

/// A reverse test ends as soon as its client hangs up: the server does not
/// go on sending to the port for the rest of the test.
#[test]
fn a_reverse_test_stops_when_the_client_hangs_up() {
    let (_srv, port) = server(&[]);
    let mine = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let p = mine.local_addr().unwrap().port();
    let mut c = connect(&port);
    c.write_all(
        format!(
            "{{\"fastudp\":1,\"seconds\":20,\"rate\":1000000,\"mode\":\"x\",\"reverse\":{{\"port\":{p},\"payload\":100,\"segments\":1,\"mmsg\":false}}}}\n"
        )
        .as_bytes(),
    )
    .unwrap();
    assert!(reply(&c).contains("ready"));
    wait_for_datagram(&mine);
    drop(c);
    // Within a short while, nothing more arrives.
    std::thread::sleep(Duration::from_millis(500));
    mine.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 2048];
    while mine.recv(&mut buf).is_ok() {}
    mine.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    assert!(
        mine.recv(&mut buf).is_err(),
        "the server kept sending after its client hung up"
    );
}

/// A paced reverse test whose next send is seconds away still sees its
/// client hang up at once: the server is free for the next client within
/// a moment, not "busy" until the paced send would have been due.
#[test]
fn a_paced_reverse_test_sees_its_client_hang_up_while_it_waits() {
    let (_srv, port) = server(&[]);
    let mine = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let p = mine.local_addr().unwrap().port();
    // 2000 bytes/s, 1000-byte datagrams, batched: a send every 0.5 s.
    let request = format!(
        "{{\"fastudp\":1,\"seconds\":30,\"rate\":2000,\"mode\":\"x\",\"reverse\":{{\"port\":{p},\"payload\":1000,\"segments\":1,\"mmsg\":true}}}}\n"
    );
    let mut c = connect(&port);
    c.write_all(request.as_bytes()).unwrap();
    assert!(reply(&c).contains("ready"));
    wait_for_datagram(&mine);
    drop(c);
    let hung_up = Instant::now();
    let answer = loop {
        std::thread::sleep(Duration::from_millis(200));
        let mut c = connect(&port);
        c.write_all(request.as_bytes()).unwrap();
        let a = reply(&c);
        if !a.contains("busy") || hung_up.elapsed() > Duration::from_secs(5) {
            break a;
        }
    };
    assert!(
        answer.contains("ready"),
        "still {answer:?} {:?} after the client hung up",
        hung_up.elapsed()
    );
}

/// `--max-rate` holds for reverse tests: the server's sending, batches
/// and trains included, stays within the client's paced rate over the
/// test, from its first call to its last.
#[test]
fn reverse_tests_keep_within_the_rate_from_first_send_to_last() {
    // (seconds, options): 8 GSO trains of 54 x 1200 bytes per call; 32
    // datagrams per call.
    for (secs, opts) in [
        ("1", &["-S", "1200", "-m"][..]),
        ("0.05", &["-s", "1200", "-m"][..]),
    ] {
        let (_srv, port) = server(&["--max-tests", "1", "--max-rate", "1M"]);
        let mut args = vec![
            "tx",
            "-D",
            "127.0.0.1",
            "-C",
            "-R",
            "--control-port",
            &port,
            "-l",
            secs,
            "-b",
            "1M",
            "--json",
        ];
        args.extend_from_slice(opts);
        let (v, out) = json_of(&fastudp(&args));
        let bytes = v["sent_by_server"].as_u64().unwrap() * 1200;
        let allowed = (125_000.0 * secs.parse::<f64>().unwrap()) as u64;
        assert!(
            bytes <= allowed,
            "{secs} s at 1 Mbit/s allows {allowed} bytes; the server sent {bytes}: {out}"
        );
    }
}

#[test]
fn no_server_and_bad_rates_are_clear_errors() {
    let port = free_tcp_port().to_string();
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.5",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    // Refused control connection: a runtime failure, on one line.
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!(
            "fastudp: error: no fastudp server at 127.0.0.1:{port} ("
        )) && err.lines().count() == 1,
        "{err}"
    );
    for bad in ["fast", "0", "-5M", "10T"] {
        let o = fastudp(&["tx", "-D", "127.0.0.1", "-b", bad, "-l", "0.5"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "-b {bad}: {err}");
        assert!(err.contains("-b"), "{err}");
    }
    let o = fastudp(&["tx", "-D", "127.0.0.1", "-b", "fast", "-l", "0.5"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "fastudp: error: -b fast: give a rate in bits per second, such as 500M or 2G\n"
    );
    // -B with an address this host does not have: a usage error, found
    // when the control connection binds to it (before any traffic).
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-B",
        "192.0.2.1",
        "-l",
        "0.5",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("fastudp: error: -B 192.0.2.1: ") && err.lines().count() == 1,
        "{err}"
    );
    // The -s that an error suggests is accepted.
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-s",
        "1000000",
        "-S",
        "1472",
        "-l",
        "0.2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    let hint = err.split("try -s ").nth(1).expect("a suggestion");
    let s: String = hint.chars().take_while(char::is_ascii_digit).collect();
    let o = fastudp(&["tx", "-D", "127.0.0.1", "-s", &s, "-S", "1472", "-l", "0.2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("-s "),
        "the suggested -s {s} was refused: {err}"
    );
    let o = fastudp(&["tx", "-D", "no-such-host.invalid", "-l", "0.5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot resolve"), "{err}");
}

#[test]
fn parallel_streams_are_counted_together() {
    let (_srv, port) = server(&["--max-tests", "1"]);
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.5",
        "-b",
        "10M",
        "-P",
        "3",
        "--json",
    ]);
    let (v, out) = json_of(&o);
    let sent = v["datagrams"].as_u64().unwrap();
    let got = v["server"]["datagrams"].as_u64().unwrap();
    assert_eq!(got + v["server"]["lost"].as_u64().unwrap(), sent, "{out}");
    assert_eq!(v["settings"]["parallel"], 3);
}

#[test]
fn logfile_takes_the_output_of_both_sides() {
    let dir = std::env::temp_dir().join(format!("fastudp-logfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("run.log");
    let log_s = log.to_str().unwrap();
    let (srv, port) = server(&["--max-tests", "1"]);
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "--control-port",
        &port,
        "-l",
        "0.5",
        "-b",
        "10M",
        "--logfile",
        log_s,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("tx sendto:") && text.contains("server:"),
        "{text}"
    );
    let _ = srv.finish();
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-l",
        "0.5",
        "--logfile",
        dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("directory"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reverse_the_server_sends_and_the_client_counts() {
    let (_srv, port) = server(&["--max-tests", "1", "--max-rate", "500M"]);
    let o = fastudp(&[
        "tx",
        "-D",
        "127.0.0.1",
        "-C",
        "-R",
        "--control-port",
        &port,
        "-l",
        "0.5",
        "-S",
        "1200",
        "-b",
        "100M",
        "--json",
    ]);
    let (v, out) = json_of(&o);
    let sent = v["sent_by_server"].as_u64().unwrap();
    assert!(sent > 0, "{out}");
    assert_eq!(
        v["datagrams"].as_u64().unwrap() + v["lost"].as_u64().unwrap(),
        sent,
        "{out}"
    );
}

/// A reverse test sends to the address of the control connection and
/// nowhere else: a request cannot name another host, and a socket on
/// another local address with the same port gets nothing.
#[test]
fn reverse_sends_only_to_the_client_that_asked() {
    let (srv, port) = server(&["--max-tests", "1"]);
    let mine = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let p = mine.local_addr().unwrap().port();
    let other = std::net::UdpSocket::bind(("127.0.0.2", p)).unwrap();
    other
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // Naming a destination is refused.
    let mut c = connect(&port);
    c.write_all(
        format!(
            "{{\"fastudp\":1,\"seconds\":0.3,\"rate\":null,\"mode\":\"x\",\"reverse\":{{\"port\":{p},\"payload\":100,\"segments\":1,\"mmsg\":false,\"host\":\"127.0.0.2\"}}}}\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let r = reply(&c);
    assert!(r.contains("refused"), "{r}");
    // A proper request: datagrams come to this address only.
    let mut c = connect(&port);
    c.write_all(
        format!(
            "{{\"fastudp\":1,\"seconds\":0.3,\"rate\":8000000,\"mode\":\"x\",\"reverse\":{{\"port\":{p},\"payload\":100,\"segments\":1,\"mmsg\":false}}}}\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("ready"), "{line}");
    wait_for_datagram(&mine);
    let mut buf = [0u8; 2048];
    assert!(
        other.recv(&mut buf).is_err(),
        "a datagram went to another address"
    );
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("datagrams"), "{line}");
    drop(c);
    let e = srv.finish();
    assert!(e.status.success(), "{}", e.stderr);
}

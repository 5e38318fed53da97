//! A browser through the proxy: headless Chromium loads a page over
//! HTTP/3 from `quic serve --upstream`, in front of a small HTTP/1.1
//! application started by the test. The HTML, a JSON API answer and a
//! 10 MB `fetch()` upload all come from (or go to) the application.

use crate::common::clients;
use crate::common::quic_server::serve_without_test_endpoints;
use crate::proxy::{full, UpBody};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::convert::Infallible;
use std::net::SocketAddr;

/// The upload's length: byte i of it is i % 251.
const UPLOAD: usize = 10_000_000;

/// The page: it fetches the JSON answer, then POSTs the upload, and
/// writes what came back (with the protocol of each request, from the
/// Resource Timing API) into its elements.
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>fastudp reverse proxy</title>
<style>
body { font: 16px/1.5 sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } code, span { font-family: monospace; }
td { padding: 0.2em 1em 0.2em 0; vertical-align: top; }
</style></head>
<body>
<h1>An application behind <code>fastudp quic serve --upstream</code></h1>
<p>This page, the JSON answer and the upload's receipt come from an HTTP/1.1 application;
the browser reaches it through fastudp over HTTP/3.</p>
<table>
<tr><td>page</td><td><span id="page">pending</span></td></tr>
<tr><td>GET /api/answer</td><td><span id="json">pending</span></td></tr>
<tr><td>POST /api/upload (10 MB)</td><td><span id="upload">pending</span></td></tr>
</table>
<script>
function proto(path) {
  var e = performance.getEntriesByName(new URL(path, location.href).href);
  return e.length ? e[e.length - 1].nextHopProtocol : 'unknown';
}
function put(id, text) { document.getElementById(id).textContent = text; }
(async function () {
  var nav = performance.getEntriesByType('navigation')[0];
  put('page', 'over ' + (nav ? nav.nextHopProtocol : 'unknown'));
  try {
    var r = await fetch('/api/answer');
    var j = await r.json();
    put('json', r.status + ' answer=' + j.answer + ' proto=' + j.proto + ' over ' + proto('/api/answer'));
  } catch (e) { put('json', 'error ' + e); }
  try {
    var n = 10000000, b = new Uint8Array(n);
    for (var i = 0; i < n; i++) b[i] = i % 251;
    var r = await fetch('/api/upload', {method: 'POST', body: b,
      headers: {'content-type': 'application/octet-stream'}});
    var j = await r.json();
    put('upload', r.status + ' len=' + j.len + ' sha256=' + j.sha256 + ' over ' + proto('/api/upload'));
  } catch (e) { put('upload', 'error ' + e); }
})();
</script>
</body></html>
"#;

fn json(v: serde_json::Value) -> http::Response<UpBody> {
    let mut r = http::Response::new(full(v.to_string()));
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

/// The application: `/` the page, `/api/answer` a JSON answer (with the
/// `X-Forwarded-Proto` it was given), `POST /api/upload` the length and
/// SHA-256 of the body as it arrived.
async fn app(req: Request<Incoming>) -> Result<http::Response<UpBody>, Infallible> {
    let r = match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/") => {
            let mut r = http::Response::new(full(PAGE));
            r.headers_mut()
                .insert("content-type", "text/html; charset=utf-8".parse().unwrap());
            r
        }
        (Method::GET, "/api/answer") => {
            let proto = req
                .headers()
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none")
                .to_string();
            json(serde_json::json!({"answer": 42, "proto": proto}))
        }
        (Method::POST, "/api/upload") => {
            let mut body = req.into_body();
            let mut c = ring::digest::Context::new(&ring::digest::SHA256);
            let mut len = 0u64;
            while let Some(f) = body.frame().await {
                let Ok(f) = f else {
                    return Ok(json(serde_json::json!({"len": -1, "sha256": "broken"})));
                };
                if let Ok(d) = f.into_data() {
                    len += d.len() as u64;
                    c.update(&d);
                }
            }
            let sha: String = c
                .finish()
                .as_ref()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            json(serde_json::json!({"len": len, "sha256": sha}))
        }
        _ => {
            let mut r = http::Response::new(full("not here"));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    };
    Ok(r)
}

/// The application on a loopback port of its own, until the runtime is
/// dropped.
fn application() -> (tokio::runtime::Runtime, SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let l = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = l.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(tcp),
                        hyper::service::service_fn(app),
                    )
                    .await;
            });
        }
    });
    (rt, addr)
}

/// Chromium, forced onto QUIC for the proxy's origin, loads the page
/// through the proxy: the page, the JSON answer and the 10 MB upload
/// each went over HTTP/3 (`h3` in Resource Timing), the answer is the
/// application's, and the application got the upload byte for byte (its
/// length and SHA-256, as it computed them, are in the DOM).
///
/// `FASTUDP_PROXY_SCREENSHOT=FILE` also saves a screenshot of the page
/// (docs/img/proxy-chromium.png was made so).
#[test]
fn chromium_through_the_proxy_over_http3() {
    let test = "chromium_through_the_proxy_over_http3";
    let Some(bin) = clients::chromium(test) else {
        return;
    };
    let (_app_rt, up) = application();
    let (mut srv, addr) = serve_without_test_endpoints(&[
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "1",
        "--upstream",
        &format!("http://{up}"),
    ]);
    let l = srv.wait_for_line(|l| l.contains("\"certificate\""));
    let v: serde_json::Value = serde_json::from_str(&l).unwrap();
    let spki = v["spki_sha256"].as_str().unwrap().to_string();
    // The budget lets the page's fetches end before the DOM is dumped;
    // virtual time does not pass while a request is under way.
    let dom = clients::chromium_dump_dom_with(
        &bin,
        "127.0.0.1",
        addr.port(),
        &spki,
        "/",
        &["--virtual-time-budget=60000"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let want_sha = clients::sha256_hex(&clients::bytes_body(UPLOAD));
    assert_eq!(clients::dom_text(&dom, "page"), "over h3", "{dom}");
    assert_eq!(
        clients::dom_text(&dom, "json"),
        "200 answer=42 proto=https over h3",
        "{dom}"
    );
    assert_eq!(
        clients::dom_text(&dom, "upload"),
        format!("200 len={UPLOAD} sha256={want_sha} over h3"),
        "{dom}"
    );
    if let Some(shot) = std::env::var_os("FASTUDP_PROXY_SCREENSHOT") {
        let profile = clients::tempdir("chromium-shot");
        let origin = format!("127.0.0.1:{}", addr.port());
        let r = clients::run_bounded(
            std::process::Command::new(&bin)
                .arg("--headless=new")
                .arg("--no-sandbox")
                .arg("--disable-gpu")
                .arg("--no-first-run")
                .arg("--enable-quic")
                .arg("--hide-scrollbars")
                .arg("--window-size=1000,420")
                .arg("--virtual-time-budget=60000")
                .arg(format!("--origin-to-force-quic-on={origin}"))
                .arg(format!("--ignore-certificate-errors-spki-list={spki}"))
                .arg(format!("--user-data-dir={}", profile.display()))
                .arg(format!("--screenshot={}", shot.to_string_lossy()))
                .arg(format!("https://{origin}/")),
        );
        let _ = std::fs::remove_dir_all(&profile);
        let (ok, _, err) = r.unwrap();
        assert!(ok, "{err}");
    }
    srv.interrupt();
    let end = srv.finish();
    assert!(!end.stderr.contains("panicked"), "{}", end.stderr);
    // The page, the answer and the upload went to the application.
    let p: serde_json::Value = serde_json::from_str(
        end.stdout
            .lines()
            .find(|l| l.contains("\"kind\":\"proxy_summary\""))
            .expect("a proxy line"),
    )
    .unwrap();
    assert!(p["forwarded"].as_u64().unwrap() >= 3, "{p}");
}

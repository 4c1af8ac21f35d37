//! A minimal synchronous WebDriver client for tests that look at a page in
//! headless Chromium.
//!
//! [`Browser::start`] runs `/usr/bin/chromedriver` on a free local port (killed
//! on drop) and opens one session of `/usr/bin/chromium` with a fresh profile
//! in a temporary folder (removed on drop). It talks plain HTTP/1.1 over
//! `std::net::TcpStream` (one `Connection: close` request per call) with
//! `serde_json` bodies, so it needs no crate beyond those the tests already
//! have. Skip a test when [`available`] says the two binaries are missing.
//!
//! Texts are read with one script per call (`innerText` of every match), so a
//! page that re-renders between "find" and "read" cannot cause a stale-element
//! error. Errors are plain `String`s that say what was asked.
//!
//! Include it with `#[path = "common/webdriver.rs"] mod webdriver;`.
#![allow(dead_code)] // each test binary uses a different part

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Chromium's flags: headless, and quiet on the network (without the
/// background-networking flags a closed network refuses its connections).
pub const CHROMIUM_FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,900",
];

/// Whether both Chromium and chromedriver are installed.
pub fn available() -> bool {
    Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists()
}

/// One chromedriver process holding one browser session.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    dir: PathBuf,
}

impl Browser {
    /// Starts chromedriver, waits until it is ready, and opens a session.
    pub fn start() -> Result<Browser, String> {
        Browser::start_with(true)
    }

    /// A browser whose pages run no script (Chromium's content setting,
    /// as a user turning JavaScript off would).
    pub fn start_without_javascript() -> Result<Browser, String> {
        Browser::start_with(false)
    }

    fn start_with(javascript: bool) -> Result<Browser, String> {
        let dir = temp_dir()?;
        let port = super::common::free_port();
        let log = std::fs::File::create(dir.join("chromedriver.log"))
            .map_err(|e| format!("creating chromedriver.log in {}: {e}", dir.display()))?;
        let log2 = log
            .try_clone()
            .map_err(|e| format!("chromedriver log: {e}"))?;
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("starting {CHROMEDRIVER}: {e}"))?;
        // From here on, Drop cleans up (an empty session deletes nothing).
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            dir,
        };
        browser.wait_ready(Duration::from_secs(20))?;

        let profile = browser.dir.join("profile");
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args, "prefs": {
                "profile.managed_default_content_settings.javascript": if javascript { 1 } else { 2 },
            }},
        }}});
        let value = browser
            .call("POST", "/session", Some(&caps))
            .map_err(|e| format!("{e}\n{}", browser.driver_log()))?;
        browser.session = value["sessionId"]
            .as_str()
            .ok_or_else(|| format!("new session: no sessionId in {value}"))?
            .to_string();
        Ok(browser)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut last;
        loop {
            if let Ok(Some(status)) = self.driver.try_wait() {
                return Err(format!(
                    "chromedriver exited ({status}) before it was ready\n{}",
                    self.driver_log()
                ));
            }
            match self.call("GET", "/status", None) {
                Ok(v) if v["ready"] == json!(true) => return Ok(()),
                Ok(v) => last = format!("not ready: {v}"),
                Err(e) => last = e,
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "chromedriver on port {} not ready after {timeout:?}: {last}\n{}",
                    self.port,
                    self.driver_log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The end of chromedriver's log, to explain a failure.
    pub fn driver_log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("chromedriver.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("chromedriver log (end):\n{}", tail.join("\n"))
    }

    /// Resizes the window (its outer size) to `width` x `height` pixels.
    pub fn set_window_size(&self, width: u32, height: u32) -> Result<(), String> {
        self.session_call(
            "POST",
            "/window/rect",
            Some(&json!({ "width": width, "height": height })),
        )
        .map(|_| ())
        .map_err(|e| format!("window size {width}x{height}: {e}"))
    }

    /// Opens `url` and waits for its load event.
    pub fn navigate(&self, url: &str) -> Result<(), String> {
        self.session_call("POST", "/url", Some(&json!({ "url": url })))
            .map(|_| ())
            .map_err(|e| format!("navigate to {url}: {e}"))
    }

    /// The rendered text of the first element matching `css`; None if none.
    pub fn text(&self, css: &str) -> Option<String> {
        self.texts(css).into_iter().next()
    }

    /// The rendered texts of all elements matching `css`, in document order.
    /// Panics (with the reason) if the browser does not answer.
    pub fn texts(&self, css: &str) -> Vec<String> {
        self.try_texts(css).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Browser::texts`], but says why when the browser does not answer.
    pub fn try_texts(&self, css: &str) -> Result<Vec<String>, String> {
        let script =
            "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);";
        let v = self
            .try_execute_with(script, &[json!(css)])
            .map_err(|e| format!("texts of `{css}`: {e}"))?;
        let list = v
            .as_array()
            .ok_or_else(|| format!("texts of `{css}`: not a list: {v}"))?;
        Ok(list
            .iter()
            .map(|t| t.as_str().unwrap_or_default().to_string())
            .collect())
    }

    /// Polls every 100 ms until the first element matching `css` exists and
    /// its text satisfies `pred`; returns that text. The error says what was
    /// last seen.
    pub fn wait_for(
        &self,
        css: &str,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String, String> {
        let start = Instant::now();
        loop {
            let last = match self.try_texts(css) {
                Ok(texts) => match texts.into_iter().next() {
                    Some(t) if pred(&t) => return Ok(t),
                    Some(t) => format!("text {t:?}"),
                    None => "no element".to_string(),
                },
                Err(e) => format!("error: {e}"),
            };
            if start.elapsed() >= timeout {
                return Err(format!("waited {timeout:?} for `{css}`; last seen: {last}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    /// Panics (with the reason) if it throws or the browser does not answer.
    pub fn execute(&self, script: &str) -> Value {
        self.try_execute_with(script, &[])
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs `script` with `arguments[0..]` = `args`.
    pub fn try_execute_with(&self, script: &str, args: &[Value]) -> Result<Value, String> {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": args })),
        )
        .map_err(|e| format!("execute {script:?}: {e}"))
    }

    /// Saves a PNG of the window to `path`.
    pub fn screenshot(&self, path: &Path) -> Result<(), String> {
        let v = self
            .session_call("GET", "/screenshot", None)
            .map_err(|e| format!("screenshot: {e}"))?;
        let b64 = v
            .as_str()
            .ok_or_else(|| format!("screenshot: not a string: {v}"))?;
        let png = base64_decode(b64).map_err(|e| format!("screenshot: {e}"))?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(path, png).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    fn session_call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, String> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// One WebDriver command; returns its `value`, or the WebDriver error.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let (status, text) = http(self.port, method, path, body)?;
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{method} {path}: HTTP {status}, not JSON ({e}): {text:.300}"))?;
        let value = json.get("value").cloned().unwrap_or(Value::Null);
        if status != 200 || value.get("error").is_some() {
            let err = value["error"].as_str().unwrap_or("?");
            let msg = value["message"].as_str().unwrap_or("");
            let msg = msg.lines().next().unwrap_or("");
            return Err(format!("{method} {path}: HTTP {status}: {err}: {msg}"));
        }
        Ok(value)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; returns status and body.
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let what = format!("{method} {path}");
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("{what}: connect to port {port}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(120))).ok();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{what}: send: {e}"))?;
    // chromedriver keeps the connection open despite `Connection: close`, so
    // the response ends where its Content-Length (or last chunk) says.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            // A signal for this process (another test's child exiting)
            // interrupted the wait: nothing was read, wait again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("{what}: read: {e} (after {} bytes)", raw.len())),
        };
        raw.extend_from_slice(&buf[..n]);
        if let Some((status, body)) =
            parse_response(&raw, n == 0).map_err(|e| format!("{what}: {e}"))?
        {
            let text =
                String::from_utf8(body).map_err(|e| format!("{what}: body not UTF-8: {e}"))?;
            return Ok((status, text));
        }
    }
}

/// The status and body of a complete response; None while more must be read.
fn parse_response(raw: &[u8], eof: bool) -> Result<Option<(u16, Vec<u8>)>, String> {
    let short = |what: &str| {
        if eof {
            Err(format!(
                "connection closed in the {what} ({} bytes)",
                raw.len()
            ))
        } else {
            Ok(None)
        }
    };
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return short("headers");
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let body = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:.100}"))?;
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_ascii_lowercase())
        })
    };
    if let Some(len) = header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| format!("bad Content-Length {len:?}"))?;
        if body.len() >= len {
            return Ok(Some((status, body[..len].to_vec())));
        }
        return short("body");
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        return match unchunk(body)? {
            Some(body) => Ok(Some((status, body))),
            None => short("chunked body"),
        };
    }
    if eof {
        Ok(Some((status, body.to_vec())))
    } else {
        Ok(None)
    }
}

/// A chunked body decoded; None if it is not complete yet.
fn unchunk(mut data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(Some(out));
        }
        if data.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Standard base64 (RFC 4648, with or without padding; whitespace ignored).
pub fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for (i, c) in text.bytes().enumerate() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(format!("base64: bad byte {c:#04x} at {i}")),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

fn temp_dir() -> Result<PathBuf, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "astraeus-webdriver-{}-{}-{nanos}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok(dir)
}

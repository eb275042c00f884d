//! A recording relay between a real agent and the daemon's loopback HTTP port: it forwards
//! every byte unchanged in both directions and keeps a copy, so a test can read afterwards
//! what the agent asked and exactly what the daemon answered (status, whole body) — the
//! independent record an agent's printed output is checked against. Requests are HTTP/1.1
//! (keep-alive, bodies sized or chunked); the daemon compresses nothing.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// What one connection carried, each direction in order.
#[derive(Default)]
struct Recorded {
    asked: Vec<u8>,
    answered: Vec<u8>,
}

/// The relay: agents connect to [`Tap::url`], it connects on to the daemon.
pub struct Tap {
    pub url: String,
    connections: Arc<Mutex<Vec<Arc<Mutex<Recorded>>>>>,
}

/// One request and what the daemon answered it.
#[derive(Debug)]
pub struct Exchange {
    pub method: String,
    /// The path, query included (`/v1/messages?beta=true`).
    pub path: String,
    pub request_body: Vec<u8>,
    /// `None` when no answer's head arrived.
    pub status: Option<u16>,
    pub response_body: Vec<u8>,
    /// Whether the answer arrived whole (its length, or a chunked body's last chunk): a client
    /// that gave up mid-stream leaves an incomplete one.
    pub complete: bool,
}

impl Exchange {
    pub fn request_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.request_body).unwrap_or(serde_json::Value::Null)
    }

    /// The `data:` payloads of a streamed (SSE) answer, parsed; `[DONE]` left out.
    pub fn events(&self) -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&self.response_body)
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
            .collect()
    }

    /// A whole (not streamed) answer, parsed.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.response_body).unwrap_or(serde_json::Value::Null)
    }

    fn streamed(&self) -> bool {
        self.response_body.starts_with(b"event:") || self.response_body.starts_with(b"data:")
    }

    /// The answer's text (not its reasoning), in whichever API the route speaks: what an agent
    /// shows its user as the model's reply.
    pub fn answer_text(&self) -> String {
        let route = self.path.split('?').next().unwrap_or_default();
        let streamed = self.streamed();
        let mut text = String::new();
        match route {
            "/v1/messages" if streamed => {
                for e in self.events() {
                    if e["type"] == "content_block_delta" && e["delta"]["type"] == "text_delta" {
                        text.push_str(e["delta"]["text"].as_str().unwrap_or_default());
                    }
                }
            }
            "/v1/messages" => {
                for block in self.json()["content"].as_array().into_iter().flatten() {
                    if block["type"] == "text" {
                        text.push_str(block["text"].as_str().unwrap_or_default());
                    }
                }
            }
            "/v1/responses" if streamed => {
                for e in self.events() {
                    if e["type"] == "response.output_text.delta" {
                        text.push_str(e["delta"].as_str().unwrap_or_default());
                    }
                }
            }
            "/v1/responses" => {
                for item in self.json()["output"].as_array().into_iter().flatten() {
                    for part in item["content"].as_array().into_iter().flatten() {
                        if part["type"] == "output_text" {
                            text.push_str(part["text"].as_str().unwrap_or_default());
                        }
                    }
                }
            }
            "/v1/chat/completions" if streamed => {
                for e in self.events() {
                    text.push_str(
                        e["choices"][0]["delta"]["content"]
                            .as_str()
                            .unwrap_or_default(),
                    );
                }
            }
            "/v1/chat/completions" => {
                text.push_str(
                    self.json()["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap_or_default(),
                );
            }
            _ => {}
        }
        text
    }

    /// Whether the route generates a reply (the routes agents talk to the model on).
    pub fn generates(&self) -> bool {
        let route = self.path.split('?').next().unwrap_or_default();
        ["/v1/messages", "/v1/responses", "/v1/chat/completions"].contains(&route)
    }
}

impl Tap {
    /// Relays `127.0.0.1:PORT` (a fresh port, in [`Tap::url`]) to `upstream` (`http://HOST:PORT`).
    pub fn start(upstream: &str) -> Tap {
        let upstream = upstream
            .strip_prefix("http://")
            .expect("an http:// address")
            .trim_end_matches('/')
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let connections: Arc<Mutex<Vec<Arc<Mutex<Recorded>>>>> = Arc::default();
        let all = connections.clone();
        // Lives as long as the test process: the listener is not needed after the test.
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(daemon) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let recorded = Arc::new(Mutex::new(Recorded::default()));
                all.lock().expect("relay list").push(recorded.clone());
                relay(client, daemon, recorded);
            }
        });
        Tap { url, connections }
    }

    /// Every request relayed so far, in the order of its connection and within it.
    pub fn exchanges(&self) -> Vec<Exchange> {
        let connections = self.connections.lock().expect("relay list");
        let mut out = Vec::new();
        for c in connections.iter() {
            let c = c.lock().expect("a relayed connection");
            let asked_all = messages(&c.asked, &[]);
            // An answer to HEAD has no body whatever its length header says.
            let heads: Vec<bool> = asked_all
                .iter()
                .map(|a| a.start.starts_with("HEAD "))
                .collect();
            let mut answers = messages(&c.answered, &heads).into_iter();
            for asked in asked_all {
                let mut words = asked.start.split(' ');
                let method = words.next().unwrap_or_default().to_string();
                let path = words.next().unwrap_or_default().to_string();
                let answer = answers.next();
                out.push(Exchange {
                    method,
                    path,
                    request_body: asked.body,
                    status: answer
                        .as_ref()
                        .and_then(|a| a.start.split(' ').nth(1)?.parse().ok()),
                    complete: answer.as_ref().is_some_and(|a| a.complete),
                    response_body: answer.map(|a| a.body).unwrap_or_default(),
                });
            }
        }
        out
    }
}

/// Copies each direction on a thread of its own, recording it; a side's end of stream is
/// passed on as a half-close.
fn relay(client: TcpStream, daemon: TcpStream, recorded: Arc<Mutex<Recorded>>) {
    let pump = |mut from: TcpStream, mut to: TcpStream, asked: bool, rec: Arc<Mutex<Recorded>>| {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                {
                    let mut r = rec.lock().expect("a relayed connection");
                    let side = if asked { &mut r.asked } else { &mut r.answered };
                    side.extend_from_slice(&buf[..n]);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    };
    let (c2, d2) = (
        client.try_clone().expect("clone the client socket"),
        daemon.try_clone().expect("clone the daemon socket"),
    );
    pump(client, daemon, true, recorded.clone());
    pump(d2, c2, false, recorded);
}

/// One HTTP/1.1 message: its start line, its body (de-chunked), whether it arrived whole.
struct Message {
    start: String,
    body: Vec<u8>,
    complete: bool,
}

/// The messages in one direction of a connection, in order; `bodiless[i]`: the `i`th carries no
/// body (the answer to a HEAD request).
fn messages(mut bytes: &[u8], bodiless: &[bool]) -> Vec<Message> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let no_body = bodiless.get(out.len()).copied().unwrap_or(false);
        let Some(end) = find(bytes, b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&bytes[..end]).to_string();
        bytes = &bytes[end + 4..];
        let mut lines = head.split("\r\n");
        let start = lines.next().unwrap_or_default().to_string();
        let (mut length, mut chunked) = (None, false);
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse::<usize>().ok(),
                "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                _ => {}
            }
        }
        if no_body {
            out.push(Message {
                start,
                body: Vec::new(),
                complete: true,
            });
        } else if chunked {
            let (body, rest, complete) = dechunk(bytes);
            out.push(Message {
                start,
                body,
                complete,
            });
            bytes = rest;
        } else {
            let n = length.unwrap_or(0);
            let complete = bytes.len() >= n;
            let n = n.min(bytes.len());
            out.push(Message {
                start,
                body: bytes[..n].to_vec(),
                complete,
            });
            bytes = &bytes[n..];
        }
    }
    out
}

/// A chunked body's bytes, what follows it, and whether its last (empty) chunk arrived.
fn dechunk(mut bytes: &[u8]) -> (Vec<u8>, &[u8], bool) {
    let mut body = Vec::new();
    loop {
        let Some(eol) = find(bytes, b"\r\n") else {
            return (body, &[], false);
        };
        let size = String::from_utf8_lossy(&bytes[..eol]);
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
        else {
            return (body, &[], false);
        };
        bytes = &bytes[eol + 2..];
        if size == 0 {
            // No trailers from the daemon: the body ends with an empty line.
            let rest = bytes.strip_prefix(b"\r\n".as_slice()).unwrap_or(bytes);
            return (body, rest, true);
        }
        if bytes.len() < size + 2 {
            body.extend_from_slice(&bytes[..size.min(bytes.len())]);
            return (body, &[], false);
        }
        body.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The relay's reading of what it recorded (no agent needed).
#[test]
fn a_head_answer_has_no_body_and_a_cut_stream_is_incomplete() {
    let asked = b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n\
        POST /v1/messages?beta=true HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}\
        POST /v1/messages HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    let answered = b"HTTP/1.1 200 OK\r\ncontent-length: 62\r\n\r\n\
        HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
        23\r\nevent: ping\ndata: {\"type\":\"ping\"}\n\n\r\n0\r\n\r\n\
        HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nevent";
    let requests = messages(asked, &[]);
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[2].body, b"{}");
    let heads: Vec<bool> = requests
        .iter()
        .map(|r| r.start.starts_with("HEAD "))
        .collect();
    let answers = messages(answered, &heads);
    assert_eq!(
        answers.len(),
        3,
        "the HEAD answer's length header ate the next answer"
    );
    assert!(answers[0].body.is_empty() && answers[0].complete);
    assert!(answers[1].complete);
    assert!(String::from_utf8_lossy(&answers[1].body).starts_with("event: ping"));
    assert!(!answers[2].complete, "a stream cut mid-chunk read as whole");
}

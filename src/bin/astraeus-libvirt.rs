//! astraeus-libvirt: the daemon's libvirt helper, the one program of the
//! package that links libvirt. astraeusd starts it on the first VM or
//! template call (`astraeus-libvirt URI`) and talks to it over its stdin and
//! stdout, one JSON object a line (src/runtime/libvirt/wire.rs): it says
//! `ready` once libvirt's event loop runs, answers each call from a thread
//! of its own (a call may block as long as libvirtd does) and reports every
//! domain's lifecycle events. It ends when its stdin closes: the daemon is
//! gone. Not meant to be run by hand.

use astraeusd::runtime::libvirt::wire::{Call, Lifecycle, Out, WireError};
use astraeusd::runtime::libvirt::{direct, CONNECTION_CLOSED};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, mpsc};

fn main() {
    let Some(uri) = std::env::args().nth(1) else {
        eprintln!("usage: astraeus-libvirt URI (started by astraeusd, not by hand)");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the helper");
    rt.block_on(serve(uri));
    // Calls still blocked in libvirt are abandoned with the process.
    std::process::exit(0);
}

async fn serve(uri: String) {
    let (out, mut lines_out) = mpsc::unbounded_channel::<Out>();
    tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(o) = lines_out.recv().await {
            let Ok(mut line) = serde_json::to_vec(&o) else {
                continue;
            };
            line.push(b'\n');
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                std::process::exit(0);
            }
        }
    });
    // Starts libvirt's event loop; every connection opened after reports here.
    let mut events = direct::events().subscribe();
    let forward = out.clone();
    tokio::spawn(async move {
        loop {
            let ev = match events.recv().await {
                Ok(ev) => ev,
                // Some were dropped: the daemon's waiters look again.
                Err(broadcast::error::RecvError::Lagged(_)) => Lifecycle {
                    domain: String::new(),
                    event: CONNECTION_CLOSED,
                    detail: 0,
                },
                Err(broadcast::error::RecvError::Closed) => return,
            };
            let _ = forward.send(Out::Event(ev));
        }
    });
    let _ = out.send(Out::Ready);
    let conn = Arc::new(direct::Connection::new(&uri));
    let mut calls = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = calls.next_line().await {
        let call: Call = match serde_json::from_str(&line) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("an unreadable call: {e}");
                continue;
            }
        };
        let (conn, out) = (conn.clone(), out.clone());
        tokio::task::spawn_blocking(move || {
            let (ok, err) = match conn.run(call.request) {
                Ok(v) => (Some(v), None),
                Err(e) => (None, Some(WireError::from(&e))),
            };
            let _ = out.send(Out::Reply {
                id: call.id,
                ok,
                err,
            });
        });
    }
}

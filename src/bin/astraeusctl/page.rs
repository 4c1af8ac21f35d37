//! `astraeusctl page`: the desktop entry's command. It opens the machine
//! page of the daemon that runs, at the address that daemon reports
//! (`PageUrl`), or says why there is none: no daemon runs, or its page is
//! off and how to turn it on. Without --session or --bus-address it looks
//! for the user's own daemon on the session bus first, then the system's.
//! It never starts a daemon: it asks the bus whether the name has an owner
//! before it asks the daemon anything (a call would activate it).
//! With --notify, what went wrong is also a desktop notification: launched
//! from a menu there is no terminal to read it in.

use astraeusd::bus::{BASE_PATH, BUS_NAME};
use std::time::Duration;

/// A bus to look on, and how to name its daemon and turn its page on.
struct Place {
    builder: zbus::connection::Builder<'static>,
    daemon: &'static str,
    config: &'static str,
    restart: &'static str,
}

fn session() -> Place {
    Place {
        builder: zbus::connection::Builder::session(),
        daemon: "your session's astraeusd",
        config: "~/.config/astraeus/node.toml",
        restart: "systemctl --user restart astraeusd",
    }
}

fn system() -> Place {
    Place {
        builder: zbus::connection::Builder::system(),
        daemon: "the system's astraeusd",
        config: "/etc/astraeus/node.toml",
        restart: "systemctl restart astraeusd",
    }
}

/// Finds the page, then prints its address (`print`) or opens it in the
/// browser (xdg-open); with `notify`, an error is also a notification.
pub async fn page(
    session_only: bool,
    address: Option<&str>,
    patience: Duration,
    print: bool,
    notify: bool,
) -> Result<(), String> {
    let places = match address {
        Some(a) => vec![Place {
            builder: zbus::connection::Builder::address(a),
            daemon: "the astraeusd on that bus",
            config: "its node.toml",
            restart: "restart it",
        }],
        None if session_only => vec![session()],
        None => vec![session(), system()],
    };
    let found = find(places, patience).await;
    let result = match found {
        Ok(url) if print => {
            outln!("{url}");
            Ok(())
        }
        Ok(url) => open(&url),
        Err(e) => Err(e),
    };
    if let (Err(e), true) = (&result, notify) {
        // The message without its kind: a person reads it.
        let (_, text) = astraeusd::cli::kind_of(e);
        if let Err(why) = notification("Astraeus machine page", text, patience).await {
            eprintln!("astraeusctl: no desktop notification ({why})");
        }
    }
    result
}

/// The page's address from the first place whose bus has a daemon.
async fn find(places: Vec<Place>, patience: Duration) -> Result<String, String> {
    for place in places {
        let conn = match tokio::time::timeout(patience, place.builder.build()).await {
            Ok(Ok(conn)) => conn,
            // No such bus here (no session, no system bus): the next place.
            _ => continue,
        };
        let dbus = zbus::fdo::DBusProxy::new(&conn)
            .await
            .map_err(|e| format!("the bus: {e}"))?;
        let name = zbus::names::BusName::try_from(BUS_NAME).expect("a valid name");
        if !dbus.name_has_owner(name).await.unwrap_or(false) {
            continue;
        }
        let manager = zbus::Proxy::new(&conn, BUS_NAME, BASE_PATH, "org.astraeus.Node1.Manager")
            .await
            .map_err(|e| format!("the daemon: {e}"))?;
        let url: String = manager.get_property("PageUrl").await.map_err(|e| {
            format!(
                "{} does not say where its page is ({e}): is it older than this astraeusctl?",
                place.daemon
            )
        })?;
        if url.is_empty() {
            return Err(format!(
                "PageOff: the machine page of {} is off: set [http] listen = \"127.0.0.1:8089\" in {}, \
                 then {}",
                place.daemon, place.config, place.restart
            ));
        }
        return Ok(url);
    }
    Err(
        "NoDaemon: no astraeusd runs for you: start your session's with `systemctl --user \
         enable --now astraeusd`, or ask for the system's (`systemctl enable --now astraeusd`)"
            .into(),
    )
}

/// Opens `url` in the user's browser.
fn open(url: &str) -> Result<(), String> {
    match std::process::Command::new("xdg-open").arg(url).status() {
        Ok(st) if st.success() => Ok(()),
        Ok(st) => Err(format!("xdg-open {url} failed ({st})")),
        Err(e) => Err(format!(
            "xdg-open: {e} (install xdg-utils, or open {url} in a browser)"
        )),
    }
}

/// A desktop notification on the session bus (org.freedesktop.Notifications).
async fn notification(summary: &str, body: &str, patience: Duration) -> Result<(), String> {
    let conn = tokio::time::timeout(patience, zbus::Connection::session())
        .await
        .map_err(|_| "the session bus did not answer".to_string())?
        .map_err(|e| e.to_string())?;
    crate::notify::notification(&conn, summary, body).await
}

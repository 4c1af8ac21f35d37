//! A template VM's readiness, probed once (the template's `readiness`):
//! libvirt's STARTED, a TCP port on the guest's addresses, an HTTP GET,
//! or the guest agent answering.

use crate::runtime::vm_host::VmHost;
use crate::slicing::template::Readiness;

/// Probes the template's VM once: what passed, or why it did not.
/// libvirt's STARTED (the default) has already happened when asked.
pub async fn probe(
    vms: &dyn VmHost,
    domain: &str,
    readiness: &Readiness,
) -> Result<String, String> {
    match readiness {
        Readiness::Started => Ok("libvirt reported it started".into()),
        Readiness::Http(url) => match http_ok(url).await {
            true => Ok(format!("GET {url} answered 2xx")),
            false => Err(format!("GET {url} did not answer 2xx")),
        },
        Readiness::Tcp {
            host: Some(host),
            port,
        } => {
            let addr = format!("{host}:{port}");
            match tcp_connects(&addr).await {
                true => Ok(format!("TCP {addr} accepted a connection")),
                false => Err(format!("TCP {addr} refused or did not answer")),
            }
        }
        Readiness::Tcp { host: None, port } => {
            let addresses = vms
                .guest_addresses(domain)
                .await
                .map_err(|e| format!("asking libvirt for the guest's addresses: {e}"))?;
            if addresses.is_empty() {
                return Err("libvirt knows no address of the guest yet \
                            (no DHCP lease, guest agent or ARP entry)"
                    .into());
            }
            let mut tried = Vec::new();
            for ip in addresses {
                let addr = std::net::SocketAddr::new(ip, *port).to_string();
                if tcp_connects(&addr).await {
                    return Ok(format!("TCP {addr} accepted a connection"));
                }
                tried.push(addr);
            }
            Err(format!(
                "TCP {} refused or did not answer",
                tried.join(", ")
            ))
        }
        Readiness::Agent => match vms.agent_answers(domain).await {
            Ok(Ok(())) => Ok("the guest agent answered".into()),
            Ok(Err(why)) => Err(format!("the guest agent does not answer: {why}")),
            Err(e) => Err(format!("asking for the guest agent: {e}")),
        },
    }
}

/// A TCP connection to `addr` opens within 2 s.
async fn tcp_connects(addr: &str) -> bool {
    let connect = tokio::net::TcpStream::connect(addr);
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(2), connect).await,
        Ok(Ok(_))
    )
}

/// A plain `GET` of an http:// URL answers 2xx within 5 s.
async fn http_ok(url: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let addr = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.") && head[9] == b'2')
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

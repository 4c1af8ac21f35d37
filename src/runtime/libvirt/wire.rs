//! What the daemon and its libvirt helper (`astraeus-libvirt`) say to each
//! other: one JSON object a line. The daemon writes [`Call`]s to the helper's
//! stdin; the helper writes [`Out`] lines to its stdout — `ready` once, then
//! each call's reply (in any order, by id) and every lifecycle event.

use crate::domain_xml::PciAddress;
use crate::error::Error;
use crate::request::VmSource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One call, numbered so that its reply finds its caller. (Externally
/// tagged throughout: serde buffers flattened and internally tagged data,
/// which loses numbers under serde_json's arbitrary_precision.)
#[derive(Serialize, Deserialize, Debug)]
pub struct Call {
    pub id: u64,
    pub request: Request,
}

/// What libvirt is asked: each is one blocking libvirt exchange in the helper.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    /// Whether the domain runs now (false when there is none): bool.
    Active {
        name: String,
    },
    /// A worker's transient domain from its source: the domain's name.
    Create {
        source: VmSource,
        worker: String,
        gpus: Vec<PciAddress>,
        gpu_memory_gb: String,
    },
    /// ACPI shutdown; nothing when the domain is gone.
    Shutdown {
        name: String,
    },
    /// Forced off when it runs.
    Destroy {
        name: String,
    },
    /// Running worker domains: (worker, domain name) pairs.
    ListWorkers,
    /// A persistent domain from XML: its name.
    Define {
        xml: String,
    },
    /// An existing domain's inactive XML.
    Definition {
        name: String,
    },
    PowerOn {
        name: String,
    },
    PowerOff {
        name: String,
        hard: bool,
    },
    /// (CPU time in ns, vCPUs).
    CpuTime {
        name: String,
    },
    GuestAddresses {
        name: String,
    },
    /// null when the guest agent answers, else why not.
    AgentAnswers {
        name: String,
    },
    ChannelPath {
        name: String,
        target: String,
    },
    /// Active domains passing any of these devices through.
    Holders {
        devices: Vec<PciAddress>,
    },
}

/// One lifecycle event: which domain, and libvirt's event and detail numbers.
impl Request {
    /// The call's name, for a deadline's message ("Create", "PowerOff").
    pub fn what(&self) -> String {
        let debug = format!("{self:?}");
        debug
            .split(|c: char| !c.is_alphanumeric())
            .next()
            .unwrap_or_default()
            .to_string()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifecycle {
    pub domain: String,
    pub event: u32,
    pub detail: u32,
}

/// A line from the helper.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum Out {
    /// Its event loop runs: calls may come.
    Ready,
    Reply {
        id: u64,
        #[serde(default)]
        ok: Option<Value>,
        #[serde(default)]
        err: Option<WireError>,
    },
    Event(Lifecycle),
}

/// The daemon's typed error, as it crosses the pipe.
#[derive(Serialize, Deserialize, Debug)]
pub struct WireError {
    pub kind: String,
    pub message: String,
}

impl From<&Error> for WireError {
    fn from(e: &Error) -> WireError {
        WireError {
            kind: e.kind().to_string(),
            message: e.message().to_string(),
        }
    }
}

impl From<WireError> for Error {
    fn from(w: WireError) -> Error {
        Error::from_kind(&w.kind, w.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_kind_crosses_the_pipe_as_itself() {
        for e in [
            Error::InvalidRequest("run.vm.domain: no domain named x".into()),
            Error::NotFound("domain x".into()),
            Error::Exists("e".into()),
            Error::AccessDenied("a".into()),
            Error::Conflict("x is running".into()),
            Error::Backend("libvirt at test:///default: gone".into()),
            Error::Busy("b".into()),
            Error::QuotaExceeded("q".into()),
            Error::Unsatisfiable("u".into()),
        ] {
            let line = serde_json::to_string(&WireError::from(&e)).unwrap();
            let back: WireError = serde_json::from_str(&line).unwrap();
            assert_eq!(Error::from(back), e);
        }
    }

    #[test]
    fn a_call_is_one_line_and_reads_back() {
        let call = Call {
            id: 7,
            request: Request::PowerOff {
                name: "a\nb".into(),
                hard: true,
            },
        };
        let line = serde_json::to_string(&call).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(
            line,
            r#"{"id":7,"request":{"power_off":{"name":"a\nb","hard":true}}}"#
        );
        let back: Call = serde_json::from_str(&line).unwrap();
        assert!(matches!(back.request, Request::PowerOff { hard: true, .. }));
        let holders = Request::Holders {
            devices: vec![crate::domain_xml::PciAddress::parse("0000:b3:00.1").unwrap()],
        };
        let line = serde_json::to_string(&holders).unwrap();
        let Request::Holders { devices } = serde_json::from_str(&line).unwrap() else {
            panic!("{line}");
        };
        assert_eq!(devices[0].bus, 0xb3);
        assert_eq!(devices[0].function, 1);
    }
}

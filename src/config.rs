//! `/etc/astraeus/node.toml`: the few settings a host owner changes.

use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

pub const DEFAULT_PATH: &str = "/etc/astraeus/node.toml";

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The machine's name in reasons and listings; the host name when unset.
    pub machine: Option<String>,
    pub access: Access,
    pub inventory: Inventory,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Access {
    /// Members of this group (and root) may submit and stop workers.
    pub group: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Inventory {
    /// How often the GPU inventory is re-read, in seconds.
    pub refresh_seconds: f64,
    /// Read GPUs through NVML; false on a host that only time-slices.
    pub nvml: bool,
    /// The driver's NVML library; searched for when unset.
    pub nvml_library: Option<std::path::PathBuf>,
    /// Force WSL2 mode on or off; detected when unset.
    pub wsl: Option<bool>,
    /// GPUs (UUIDs or PCI bus ids) owned by a time-slicing baseboard: never offered.
    pub baseboard: Vec<String>,
}

impl Default for Access {
    fn default() -> Access {
        Access {
            group: "astraeus".into(),
        }
    }
}

impl Default for Inventory {
    fn default() -> Inventory {
        Inventory {
            refresh_seconds: 2.0,
            nvml: true,
            nvml_library: None,
            wsl: None,
            baseboard: Vec::new(),
        }
    }
}

impl Config {
    /// Reads the file; a missing default file means defaults, a missing
    /// explicitly named one is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(Config::default())
            }
            Err(e) => return Err(Error::Backend(format!("config {}: {e}", path.display()))),
        };
        let c: Config = toml::from_str(&text).map_err(|e| {
            Error::InvalidRequest(format!("config {}: {}", path.display(), e.message()))
        })?;
        if !(0.1..=3600.0).contains(&c.inventory.refresh_seconds) {
            return Err(Error::field(
                "inventory.refresh_seconds",
                "a number of seconds from 0.1 to 3600",
            ));
        }
        Ok(c)
    }

    pub fn refresh(&self) -> Duration {
        Duration::from_secs_f64(self.inventory.refresh_seconds)
    }
}

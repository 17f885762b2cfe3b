//! The GPU collection's metric groups: what `spec.gpu.groups` may name, and what the
//! agent reads and exports of each GPU for each. One home for the names: the CRD's
//! enumeration, the node configuration and the agent's field table all use [`GpuGroup`].

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One group of GPU values (dcgm-exporter's fields, by what they describe).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "crd", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum GpuGroup {
    /// GPU and memory-copy utilization.
    Utilization,
    /// Framebuffer free, used, reserved, total.
    Memory,
    /// GPU and memory temperature.
    Temperature,
    /// Power draw, enforced limit, total energy.
    Power,
    /// SM and memory clocks, throttle reasons.
    Clocks,
    /// PCIe link generation and width, throughput, replays.
    Pcie,
    /// ECC error counts and row remapping (read for health whatever the groups).
    Ecc,
    /// NVLink bandwidth and error counters, on GPUs with NVLink.
    Nvlink,
    /// Each compute process's framebuffer use, with its pod.
    Processes,
}

impl GpuGroup {
    pub const ALL: [GpuGroup; 9] = [
        GpuGroup::Utilization,
        GpuGroup::Memory,
        GpuGroup::Temperature,
        GpuGroup::Power,
        GpuGroup::Clocks,
        GpuGroup::Pcie,
        GpuGroup::Ecc,
        GpuGroup::Nvlink,
        GpuGroup::Processes,
    ];

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

/// A set of [`GpuGroup`]s; in JSON, the sorted list of their names.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuGroups(u16);

impl GpuGroups {
    /// Every group: what the agent collects unless a configuration names fewer.
    pub const ALL: GpuGroups = {
        let mut bits = 0;
        let mut i = 0;
        while i < GpuGroup::ALL.len() {
            bits |= GpuGroup::ALL[i].bit();
            i += 1;
        }
        GpuGroups(bits)
    };
    pub const NONE: GpuGroups = GpuGroups(0);

    pub fn contains(self, group: GpuGroup) -> bool {
        self.0 & group.bit() != 0
    }

    pub fn union(self, other: GpuGroups) -> GpuGroups {
        GpuGroups(self.0 | other.0)
    }

    /// Whether this is every group (the default, left out of the JSON).
    pub fn is_all(&self) -> bool {
        *self == GpuGroups::ALL
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = GpuGroup> {
        GpuGroup::ALL.into_iter().filter(move |g| self.contains(*g))
    }
}

impl Default for GpuGroups {
    fn default() -> Self {
        GpuGroups::ALL
    }
}

impl FromIterator<GpuGroup> for GpuGroups {
    fn from_iter<I: IntoIterator<Item = GpuGroup>>(groups: I) -> Self {
        GpuGroups(groups.into_iter().fold(0, |bits, g| bits | g.bit()))
    }
}

impl std::fmt::Debug for GpuGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl Serialize for GpuGroups {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for GpuGroups {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // At most a few names: an unknown one is an error, not a silent gap.
        let names = Vec::<GpuGroup>::deserialize(deserializer)?;
        Ok(names.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_travel_as_their_sorted_names() {
        let groups: GpuGroups = [GpuGroup::Nvlink, GpuGroup::Utilization, GpuGroup::Nvlink].into_iter().collect();
        let json = serde_json::to_string(&groups).unwrap();
        assert_eq!(json, r#"["utilization","nvlink"]"#);
        assert_eq!(serde_json::from_str::<GpuGroups>(&json).unwrap(), groups);
        assert!(serde_json::from_str::<GpuGroups>(r#"["utilisation"]"#).is_err());
    }

    #[test]
    fn all_holds_every_group_and_none_holds_none() {
        assert!(GpuGroup::ALL.iter().all(|g| GpuGroups::ALL.contains(*g) && !GpuGroups::NONE.contains(*g)));
        assert_eq!(GpuGroups::ALL.iter().count(), GpuGroup::ALL.len());
        assert_eq!(GpuGroups::default(), GpuGroups::ALL);
        let one: GpuGroups = [GpuGroup::Pcie].into_iter().collect();
        assert_eq!(one.union(GpuGroups::NONE), one);
        assert!(!one.contains(GpuGroup::Ecc) && GpuGroups::NONE.is_empty());
    }
}

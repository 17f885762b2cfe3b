//! The GPU series under dcgm-exporter's names and labels, so NVIDIA's Grafana dashboard
//! (12239) and users' alert rules work unchanged: `DCGM_FI_DEV_*` with `gpu`, `UUID`,
//! `pci_bus_id`, `device`, `modelName`, `Hostname` and `DCGM_FI_DRIVER_VERSION`, plus
//! `namespace`, `pod` and `container` where a pod holds the GPU (one series per pod on a
//! shared GPU, its replica in `vgpu`), plus the agent's instance labels.
//!
//! Units are dcgm-exporter's: framebuffer in MiB (bytes divided and cut, as DCGM does;
//! nvidia-smi rounds, so the two can differ by 1), energy in mJ, power in W, clocks in
//! MHz. dcgm-exporter's counters (energy, PCIe replays, ECC, remapped rows) keep their
//! exact names: typed gauge, since a counter on the page would gain `_total`. The fields dcgm-exporter exports by default come first in [`FIELDS`]; the rest
//! (ECC, link, limits) are the fields of its catalogue it leaves commented out.

use std::fmt;

use prometheus_client::metrics::MetricType;

use super::{firsts, holdings, keep_firsts, Gpu, GpuGroup, GpuHolders, GpuIdentity, GpuSnapshot};
use crate::{
    series::{Family, FamilyEncoder, Labels, Scope},
    state::{InstanceLabels, PodRef},
};

/// One exported DCGM field: its name, help, type and where its value comes from.
pub struct Field {
    pub name: &'static str,
    /// Exported while the collection reads this group.
    pub group: GpuGroup,
    pub help: &'static str,
    pub kind: MetricType,
    pub value: fn(&Gpu) -> Option<f64>,
}

const MIB: f64 = 1024.0 * 1024.0;

fn mib(bytes: Option<u64>) -> Option<f64> {
    bytes.map(|b| (b as f64 / MIB).floor())
}

fn num<T: Into<f64>>(v: Option<T>) -> Option<f64> {
    v.map(Into::into)
}

fn big(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

/// Every DCGM field the agent exports, in dcgm-exporter's default order first.
pub const FIELDS: &[Field] = &[
    Field {
        name: "DCGM_FI_DEV_SM_CLOCK",
        group: GpuGroup::Clocks,
        help: "SM clock frequency (in MHz).",
        kind: MetricType::Gauge,
        value: |g| num(g.values.sm_clock_mhz),
    },
    Field {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        group: GpuGroup::Clocks,
        help: "Memory clock frequency (in MHz).",
        kind: MetricType::Gauge,
        value: |g| num(g.values.memory_clock_mhz),
    },
    Field {
        name: "DCGM_FI_DEV_MEMORY_TEMP",
        group: GpuGroup::Temperature,
        help: "Memory temperature (in C).",
        kind: MetricType::Gauge,
        value: |g| big(g.values.temperature_memory_c),
    },
    Field {
        name: "DCGM_FI_DEV_GPU_TEMP",
        group: GpuGroup::Temperature,
        help: "GPU temperature (in C).",
        kind: MetricType::Gauge,
        value: |g| num(g.values.temperature_gpu_c),
    },
    Field {
        name: "DCGM_FI_DEV_POWER_USAGE",
        group: GpuGroup::Power,
        help: "Power draw (in W).",
        kind: MetricType::Gauge,
        value: |g| g.values.power_watts,
    },
    Field {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        group: GpuGroup::Power,
        help: "Total energy consumption since boot (in mJ).",
        kind: MetricType::Gauge,
        value: |g| big(g.values.energy_millijoules),
    },
    Field {
        name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        group: GpuGroup::Pcie,
        help: "Total number of PCIe retries.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.pcie_replays),
    },
    Field {
        name: "DCGM_FI_DEV_GPU_UTIL",
        group: GpuGroup::Utilization,
        help: "GPU utilization (in %).",
        kind: MetricType::Gauge,
        value: |g| num(g.values.utilization_gpu),
    },
    Field {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        group: GpuGroup::Utilization,
        help: "Memory utilization (in %).",
        kind: MetricType::Gauge,
        value: |g| num(g.values.utilization_memory),
    },
    Field {
        name: "DCGM_FI_DEV_FB_FREE",
        group: GpuGroup::Memory,
        help: "Framebuffer memory free (in MiB).",
        kind: MetricType::Gauge,
        value: |g| mib(g.values.memory_free_bytes),
    },
    Field {
        name: "DCGM_FI_DEV_FB_USED",
        group: GpuGroup::Memory,
        help: "Framebuffer memory used (in MiB).",
        kind: MetricType::Gauge,
        value: |g| mib(g.values.memory_used_bytes),
    },
    Field {
        name: "DCGM_FI_DEV_FB_RESERVED",
        group: GpuGroup::Memory,
        help: "Framebuffer memory reserved (in MiB).",
        kind: MetricType::Gauge,
        value: |g| mib(g.values.memory_reserved_bytes),
    },
    Field {
        name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        group: GpuGroup::Ecc,
        help: "Number of remapped rows for uncorrectable errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.remapped_rows.uncorrectable),
    },
    Field {
        name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        group: GpuGroup::Ecc,
        help: "Number of remapped rows for correctable errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.remapped_rows.correctable),
    },
    Field {
        name: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        group: GpuGroup::Ecc,
        help: "Whether remapping of rows has failed.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.remapped_rows.failure),
    },
    Field {
        name: "DCGM_FI_DEV_ROW_REMAP_PENDING",
        group: GpuGroup::Ecc,
        help: "Whether rows are pending remapping (a GPU reset applies them).",
        kind: MetricType::Gauge,
        value: |g| big(g.values.remapped_rows.pending),
    },
    Field {
        name: "DCGM_FI_DEV_FB_TOTAL",
        group: GpuGroup::Memory,
        help: "Framebuffer memory total (in MiB).",
        kind: MetricType::Gauge,
        value: |g| mib(g.values.memory_total_bytes),
    },
    Field {
        name: "DCGM_FI_DEV_FB_USED_PERCENT",
        group: GpuGroup::Memory,
        help: "Framebuffer memory used, percent of the usable (total less reserved).",
        kind: MetricType::Gauge,
        value: |g| g.values.memory_used_percent(),
    },
    Field {
        name: "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        group: GpuGroup::Power,
        help: "Enforced power limit (in W).",
        kind: MetricType::Gauge,
        value: |g| g.values.power_limit_watts,
    },
    Field {
        name: "DCGM_FI_DEV_PCIE_LINK_GEN",
        group: GpuGroup::Pcie,
        help: "Current PCIe link generation.",
        kind: MetricType::Gauge,
        value: |g| num(g.values.pcie_link_gen),
    },
    Field {
        name: "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        group: GpuGroup::Pcie,
        help: "Current PCIe link width (lanes).",
        kind: MetricType::Gauge,
        value: |g| num(g.values.pcie_link_width),
    },
    Field {
        name: "DCGM_FI_PROF_PCIE_TX_BYTES",
        group: GpuGroup::Pcie,
        help: "PCIe bytes transmitted per second (NVML's 20 ms sample).",
        kind: MetricType::Gauge,
        value: |g| big(g.values.pcie_tx_bytes_per_second),
    },
    Field {
        name: "DCGM_FI_PROF_PCIE_RX_BYTES",
        group: GpuGroup::Pcie,
        help: "PCIe bytes received per second (NVML's 20 ms sample).",
        kind: MetricType::Gauge,
        value: |g| big(g.values.pcie_rx_bytes_per_second),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        group: GpuGroup::Ecc,
        help: "Total number of single-bit volatile ECC errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.ecc.corrected_volatile),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        group: GpuGroup::Ecc,
        help: "Total number of double-bit volatile ECC errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.ecc.uncorrected_volatile),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        group: GpuGroup::Ecc,
        help: "Total number of single-bit persistent ECC errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.ecc.corrected_aggregate),
    },
    Field {
        name: "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        group: GpuGroup::Ecc,
        help: "Total number of double-bit persistent ECC errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.ecc.uncorrected_aggregate),
    },
    // dcgm-exporter's default NVLink field: a rate despite its name, typed gauge there
    // too since 2026-05 (#658).
    Field {
        name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        group: GpuGroup::Nvlink,
        help: "NVLink data throughput, TX and RX over every link (KiB/s divided by 1000, as DCGM gives it).",
        kind: MetricType::Gauge,
        value: |g| g.values.nvlink.and_then(|l| l.bandwidth),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        group: GpuGroup::Nvlink,
        help: "Total number of NVLink flow-control CRC errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.nvlink.and_then(|l| l.crc_flit_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        group: GpuGroup::Nvlink,
        help: "Total number of NVLink data CRC errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.nvlink.and_then(|l| l.crc_data_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        group: GpuGroup::Nvlink,
        help: "Total number of NVLink retries.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.nvlink.and_then(|l| l.replay_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        group: GpuGroup::Nvlink,
        help: "Total number of NVLink recovery errors.",
        kind: MetricType::Gauge,
        value: |g| big(g.values.nvlink.and_then(|l| l.recovery_errors)),
    },
    Field {
        name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        group: GpuGroup::Clocks,
        help: "Current clock throttle reasons (NVML's bit mask).",
        kind: MetricType::Gauge,
        value: |g| big(g.values.throttle_reasons),
    },
];

/// The labels that name one GPU, as dcgm-exporter names them (the health series carry
/// these alone).
pub fn gpu_labels(id: &GpuIdentity, hostname: &str) -> Vec<(&'static str, String)> {
    vec![
        ("gpu", id.index.to_string()),
        ("UUID", id.uuid.clone()),
        ("pci_bus_id", id.pci_bus_id.clone()),
        ("device", id.device.clone()),
        ("modelName", id.model.clone()),
        ("Hostname", hostname.to_owned()),
    ]
}

/// The identity labels of one GPU's series (and its pod's replica), as dcgm-exporter
/// names them.
pub fn identity_labels(gpu: &Gpu, hostname: &str, driver: &str, replica: Option<u32>) -> Vec<(&'static str, String)> {
    let mut labels = gpu_labels(&gpu.identity, hostname);
    labels.push(("DCGM_FI_DRIVER_VERSION", driver.to_owned()));
    if let Some(replica) = replica {
        labels.push(("vgpu", replica.to_string()));
    }
    labels
}

/// One GPU as one holder sees it: the pod (if any) and the labels of its series.
struct Seen<'a> {
    gpu: &'a Gpu,
    pod: Option<&'a PodRef>,
    labels: Vec<(&'static str, String)>,
}

/// The GPUs `scope` sees ([`holdings`]), with the labels of their series; never two with
/// the same labels (counted in the snapshot's `duplicate_series`).
fn seen<'a>(snapshot: &'a GpuSnapshot, hostname: &str, holders: &'a GpuHolders, scope: Scope<'_>) -> Vec<Seen<'a>> {
    let seen: Vec<Seen<'a>> = holdings(snapshot, holders, scope)
        .into_iter()
        .map(|h| Seen {
            gpu: h.gpu,
            pod: h.pod,
            labels: identity_labels(h.gpu, hostname, &snapshot.driver_version, h.replica),
        })
        .collect();
    let firsts = firsts(&seen, |s| (&s.labels, s.pod.map(pod_labels)));
    keep_firsts(seen, firsts, &snapshot.duplicate_series)
}

/// What a pod adds to a series' labels.
pub(super) fn pod_labels(pod: &PodRef) -> (&str, &str, &str, &[(String, String)]) {
    (&pod.namespace, &pod.pod, &pod.container, &pod.labels)
}

/// Every DCGM field of every GPU `scope` sees.
pub fn encode_gpus(
    snapshot: &GpuSnapshot,
    hostname: &str,
    instance: &InstanceLabels,
    holders: &GpuHolders,
    scope: Scope<'_>,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let seen = seen(snapshot, hostname, holders, scope);
    if seen.is_empty() {
        return Ok(());
    }
    for field in FIELDS.iter().filter(|f| snapshot.groups.contains(f.group)) {
        let mut family = Family::new(field.name, field.help, field.kind);
        for s in &seen {
            family.push(Labels::held_by(instance, s.pod).fields(&s.labels), (field.value)(s.gpu));
        }
        family.write(encoder)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, sync::Arc};

    use super::*;
    use crate::{
        gpu::{GpuHolder, GpuIdentity, GpuValues},
        routing::Routing,
    };

    fn gpu(index: u32) -> Gpu {
        Gpu {
            identity: GpuIdentity {
                index,
                uuid: format!("GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd"),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x53 + index),
                device: format!("nvidia{index}"),
                model: "NVIDIA H100 80GB HBM3".into(),
            },
            values: GpuValues {
                utilization_gpu: Some(40 + index),
                memory_used_bytes: Some(2048 * 1024 * 1024),
                energy_millijoules: Some(5_000),
                ..GpuValues::default()
            },
            ..Gpu::default()
        }
    }

    fn snapshot(gpus: Vec<Gpu>) -> GpuSnapshot {
        GpuSnapshot { driver_version: "550.54.15".into(), gpus, collections: 1, ..GpuSnapshot::default() }
    }

    fn render(snapshot: &GpuSnapshot, holders: &GpuHolders) -> String {
        struct Text(String);
        impl FamilyEncoder for Text {
            fn encode_family(&mut self, family: &Family<'_>) -> Result<(), fmt::Error> {
                for (labels, value) in family.series() {
                    let mut pairs = Vec::new();
                    labels.try_for_each(|k, v| {
                        pairs.push(format!("{k}={v}"));
                        Ok::<_, fmt::Error>(())
                    })?;
                    self.0 += &format!("{} {} {value}\n", family.classic_name(), pairs.join(","));
                }
                Ok(())
            }
        }
        let mut text = Text(String::new());
        let routing = Routing::default();
        encode_gpus(snapshot, "node-1", &InstanceLabels::default(), holders, Scope::Exposition(&routing), &mut text)
            .unwrap();
        text.0
    }

    #[test]
    fn each_gpu_carries_dcgm_exporters_labels_in_its_units() {
        let text = render(&snapshot(vec![gpu(0), gpu(1)]), &GpuHolders::new());
        let util0 = text.lines().find(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL ") && l.contains("gpu=0,")).unwrap();
        for label in [
            "gpu=0",
            "UUID=GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
            "pci_bus_id=00000000:53:00.0",
            "device=nvidia0",
            "modelName=NVIDIA H100 80GB HBM3",
            "Hostname=node-1",
            "DCGM_FI_DRIVER_VERSION=550.54.15",
        ] {
            assert!(util0.contains(label), "{label} missing in {util0}");
        }
        assert!(util0.ends_with(" 40"), "{util0}");
        assert!(text.lines().any(|l| l.starts_with("DCGM_FI_DEV_FB_USED ") && l.ends_with(" 2048")), "{text}");
        // dcgm-exporter's counters keep their exact names (no `_total`).
        assert!(text.contains("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION "), "{text}");
        assert!(!text.contains("_total"), "{text}");
        // Values the GPU did not give are left out, not zero.
        assert!(!text.contains("DCGM_FI_DEV_POWER_USAGE"), "{text}");
    }

    #[test]
    fn a_shared_gpu_has_one_series_per_pod_with_its_replica() {
        let pod = |name: &str| {
            Arc::new(PodRef {
                namespace: "team-a".into(),
                pod: name.into(),
                container: "c".into(),
                ..PodRef::default()
            })
        };
        let uuid = gpu(0).identity.uuid.to_ascii_uppercase();
        let holders = GpuHolders::from([(
            uuid,
            vec![GpuHolder { pod: pod("p1"), replica: Some(0) }, GpuHolder { pod: pod("p2"), replica: Some(1) }],
        )]);
        let text = render(&snapshot(vec![gpu(0)]), &holders);
        let util: BTreeSet<_> = text.lines().filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL ")).collect();
        assert_eq!(util.len(), 2, "{text}");
        assert!(util.iter().any(|l| l.contains("pod=p1") && l.contains("vgpu=0")));
        assert!(util.iter().any(|l| l.contains("pod=p2") && l.contains("vgpu=1")));
    }

    #[test]
    fn two_gpus_of_one_identity_are_one_series_and_counted() {
        // Never from NVML (each GPU has its index): the last guard of the page.
        let s = snapshot(vec![gpu(0), gpu(0), gpu(1)]);
        let text = render(&s, &GpuHolders::new());
        assert_eq!(text.lines().filter(|l| l.starts_with("DCGM_FI_DEV_GPU_UTIL ")).count(), 2, "{text}");
        assert_eq!(s.duplicate_series.get(), 1);
    }

    #[test]
    fn a_lost_gpu_or_a_stale_snapshot_gives_no_values() {
        let mut lost = gpu(1);
        lost.lost = true;
        let text = render(&snapshot(vec![gpu(0), lost]), &GpuHolders::new());
        assert!(text.contains("gpu=0,") && !text.contains("gpu=1,"), "{text}");
        let stale = GpuSnapshot { stale: true, ..snapshot(vec![gpu(0)]) };
        assert_eq!(render(&stale, &GpuHolders::new()), "");
    }

    #[test]
    fn only_the_groups_the_collection_read_are_exported() {
        let mut with_links = gpu(0);
        with_links.values.nvlink = Some(crate::gpu::NvLinkCounts { bandwidth: Some(12.5), ..Default::default() });
        let all = render(&snapshot(vec![with_links.clone()]), &GpuHolders::new());
        assert!(all.contains("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL ") && all.contains(" 12.5\n"), "{all}");
        let groups = [GpuGroup::Nvlink].into_iter().collect();
        let nvlink_only = GpuSnapshot { groups, ..snapshot(vec![with_links]) };
        let text = render(&nvlink_only, &GpuHolders::new());
        assert!(text.contains("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL "), "{text}");
        assert!(!text.contains("DCGM_FI_DEV_GPU_UTIL") && !text.contains("DCGM_FI_DEV_FB_USED"), "{text}");
        // A GPU without NVLink has no NVLink series.
        assert!(!render(&snapshot(vec![gpu(1)]), &GpuHolders::new()).contains("NVLINK"));
    }

    #[test]
    fn every_group_has_a_field_and_every_field_a_group_the_crd_names() {
        for group in GpuGroup::ALL.into_iter().filter(|g| *g != GpuGroup::Processes) {
            assert!(FIELDS.iter().any(|f| f.group == group), "{group:?} exports nothing");
        }
    }

    #[test]
    fn field_names_are_dcgms_and_unique() {
        let names: BTreeSet<_> = FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names.len(), FIELDS.len());
        assert!(FIELDS.iter().all(|f| f.name.starts_with("DCGM_FI_DEV_") || f.name.starts_with("DCGM_FI_PROF_")));
    }
}

//! The kubelet's answers decoded with their bounds: the one place every list and string
//! of a pod-resources answer is bounded, whoever reads it afterwards (the Neuron devices
//! and cores, the EFA devices, the GPUs, the DRA claims of each driver).
//!
//! prost would decode every entry of an answer into memory first (2.5 M ids of one
//! container took the agent from 47 to 227 MB), so the messages are read here field by
//! field, with prost's wire-format primitives, into the same [`proto`] structs:
//! - a device id (a device plugin's) or a claimed device (a DRA claim's) is kept while its
//!   kind ([`Kind`]) has room: [`MAX_POD_RESOURCES_DEVICES_PER_KIND`] each; the others are
//!   skipped unread, and counted;
//! - what no reader wants is skipped as it is read: resources of other device plugins,
//!   devices of other DRA drivers, CDI devices, topology, CPU and memory lists;
//! - a resource entry, claim, container or pod is kept only while it holds a kept device:
//!   the bounds on devices bound everything kept;
//! - a string longer than [`MAX_POD_RESOURCES_STRING_BYTES`] is kept as its first 257
//!   bytes (every later check of its length refuses it), and counted.
//!
//! Each answer comes with what was cut ([`Cuts`]), for `neuron_agent_kubelet_entries_cut_total`.

use std::marker::PhantomData;

use api::{
    hardware::{EFA_DRA_DRIVER, NEURON_DRA_DRIVER, NVIDIA_DRA_DRIVER},
    limits::{MAX_POD_RESOURCES_DEVICES_PER_KIND, MAX_POD_RESOURCES_STRING_BYTES},
};
use bytes::{Buf, Bytes};
use prost::encoding::{check_wire_type, decode_key, decode_varint, skip_field, DecodeContext, WireType};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

use super::{proto, Unit, EFA};
use crate::attribution::gpus::is_gpu_resource;

/// The kinds of device the agent reads from an answer, each bounded on its own (a flood of
/// one kind leaves the others whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Neuron,
    Efa,
    Nvidia,
}

impl Kind {
    const COUNT: usize = 3;

    /// The kind of a device plugin's resource; `None`: not read.
    pub fn of_resource(name: &str) -> Option<Kind> {
        if Unit::of_resource(name).is_some() {
            Some(Kind::Neuron)
        } else if name == EFA {
            Some(Kind::Efa)
        } else if is_gpu_resource(name) {
            Some(Kind::Nvidia)
        } else {
            None
        }
    }

    /// The kind of a DRA driver's devices; `None`: not read.
    pub fn of_driver(name: &str) -> Option<Kind> {
        match name {
            NEURON_DRA_DRIVER => Some(Kind::Neuron),
            EFA_DRA_DRIVER => Some(Kind::Efa),
            NVIDIA_DRA_DRIVER => Some(Kind::Nvidia),
            _ => None,
        }
    }
}

/// The lists of an answer entries are cut from; the values of the `list` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum List {
    /// A device plugin's ids, past the bound of their kind.
    DeviceIds,
    /// A DRA claim's devices, past the bound of their kind.
    ClaimedDevices,
    /// Strings cut to their bound (the entry is kept).
    Strings,
}

impl List {
    pub const ALL: [List; 3] = [List::DeviceIds, List::ClaimedDevices, List::Strings];

    pub fn as_str(self) -> &'static str {
        match self {
            List::DeviceIds => "device_ids",
            List::ClaimedDevices => "claimed_devices",
            List::Strings => "strings",
        }
    }
}

/// What the bounds cut from one answer, by [`List`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cuts([u64; List::ALL.len()]);

impl Cuts {
    pub fn get(&self, list: List) -> u64 {
        self.0[list as usize]
    }

    fn count(&mut self, list: List) {
        self.0[list as usize] += 1;
    }

    /// Adds another answer's.
    pub fn add(&mut self, other: &Cuts) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0) {
            *mine += theirs;
        }
    }
}

/// An answer and what its bounds cut.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Bounded<T> {
    pub answer: T,
    pub cuts: Cuts,
}

/// Why an answer could not be read (it is then refused whole, as prost would).
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error(transparent)]
    Wire(#[from] prost::DecodeError),
    #[error("a length past the end of the message")]
    Truncated,
    #[error("a string that is not UTF-8")]
    NotUtf8,
}

/// Room left for devices of each kind in one answer, and what was cut.
pub struct Budget {
    ids: [usize; Kind::COUNT],
    claimed: [usize; Kind::COUNT],
    cuts: Cuts,
}

impl Budget {
    fn new() -> Self {
        let room = [MAX_POD_RESOURCES_DEVICES_PER_KIND; Kind::COUNT];
        Budget { ids: room, claimed: room, cuts: Cuts::default() }
    }

    /// Takes room for one entry of `list` of `kind`; `false` (and counted) when there is none.
    fn take(&mut self, list: List, kind: Kind) -> bool {
        let room = match list {
            List::DeviceIds => &mut self.ids[kind as usize],
            List::ClaimedDevices => &mut self.claimed[kind as usize],
            List::Strings => return true,
        };
        let taken = *room > 0;
        match taken {
            true => *room -= 1,
            false => self.cuts.count(list),
        }
        taken
    }
}

/// An answer message read with the bounds.
pub trait Decode: Sized {
    fn decode(message: Bytes, budget: &mut Budget) -> Result<Self, AnswerError>;
}

/// Reads one answer.
pub fn decode<T: Decode>(message: Bytes) -> Result<Bounded<T>, AnswerError> {
    let mut budget = Budget::new();
    let answer = T::decode(message, &mut budget)?;
    Ok(Bounded { answer, cuts: budget.cuts })
}

/// Calls `field` with the tag and wire type of each field of `message`; it reads or skips
/// the value.
fn each_field(
    mut message: Bytes,
    mut field: impl FnMut(u32, WireType, &mut Bytes) -> Result<(), AnswerError>,
) -> Result<(), AnswerError> {
    while message.has_remaining() {
        let (tag, wire_type) = decode_key(&mut message)?;
        field(tag, wire_type, &mut message)?;
    }
    Ok(())
}

/// A field no reader wants.
fn skip(tag: u32, wire_type: WireType, buf: &mut Bytes) -> Result<(), AnswerError> {
    Ok(skip_field(wire_type, tag, buf, DecodeContext::default())?)
}

/// A length-delimited value: an embedded message, or a string's bytes (not copied).
fn delimited(wire_type: WireType, buf: &mut Bytes) -> Result<Bytes, AnswerError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    let len = usize::try_from(decode_varint(buf)?).map_err(|_| AnswerError::Truncated)?;
    if len > buf.remaining() {
        return Err(AnswerError::Truncated);
    }
    Ok(buf.split_to(len))
}

/// A string field, cut past its bound (counted).
fn string(wire_type: WireType, buf: &mut Bytes, budget: &mut Budget) -> Result<String, AnswerError> {
    text(delimited(wire_type, buf)?, budget)
}

/// A string's bytes, cut past the bound (counted).
fn text(bytes: Bytes, budget: &mut Budget) -> Result<String, AnswerError> {
    if bytes.len() <= MAX_POD_RESOURCES_STRING_BYTES {
        return String::from_utf8(bytes.to_vec()).map_err(|_| AnswerError::NotUtf8);
    }
    budget.cuts.count(List::Strings);
    // A cut character becomes U+FFFD, never shorter: the string stays past the bound.
    Ok(String::from_utf8_lossy(&bytes[..=MAX_POD_RESOURCES_STRING_BYTES]).into_owned())
}

impl Decode for proto::ListPodResourcesResponse {
    fn decode(message: Bytes, budget: &mut Budget) -> Result<Self, AnswerError> {
        let mut out = Self::default();
        each_field(message, |tag, wire_type, buf| match tag {
            1 => {
                let pod = pod(delimited(wire_type, buf)?, budget)?;
                if !pod.containers.is_empty() {
                    out.pod_resources.push(pod);
                }
                Ok(())
            }
            _ => skip(tag, wire_type, buf),
        })?;
        Ok(out)
    }
}

impl Decode for proto::AllocatableResourcesResponse {
    fn decode(message: Bytes, budget: &mut Budget) -> Result<Self, AnswerError> {
        let mut out = Self::default();
        each_field(message, |tag, wire_type, buf| match tag {
            1 => {
                out.devices.extend(devices(delimited(wire_type, buf)?, budget)?);
                Ok(())
            }
            _ => skip(tag, wire_type, buf),
        })?;
        Ok(out)
    }
}

/// A pod, with its containers that hold something read.
fn pod(message: Bytes, budget: &mut Budget) -> Result<proto::PodResources, AnswerError> {
    let mut pod = proto::PodResources::default();
    each_field(message, |tag, wire_type, buf| {
        match tag {
            1 => pod.name = string(wire_type, buf, budget)?,
            2 => pod.namespace = string(wire_type, buf, budget)?,
            3 => pod.containers.extend(container(delimited(wire_type, buf)?, budget)?),
            _ => skip(tag, wire_type, buf)?,
        }
        Ok(())
    })?;
    Ok(pod)
}

/// A container; `None` when it holds nothing read.
fn container(message: Bytes, budget: &mut Budget) -> Result<Option<proto::ContainerResources>, AnswerError> {
    let mut container = proto::ContainerResources::default();
    each_field(message, |tag, wire_type, buf| {
        match tag {
            1 => container.name = string(wire_type, buf, budget)?,
            2 => container.devices.extend(devices(delimited(wire_type, buf)?, budget)?),
            5 => container.dynamic_resources.extend(claim(delimited(wire_type, buf)?, budget)?),
            _ => skip(tag, wire_type, buf)?,
        }
        Ok(())
    })?;
    let holds = !container.devices.is_empty() || !container.dynamic_resources.is_empty();
    Ok(holds.then_some(container))
}

/// A device plugin's resource of a container; `None` when it is not read or none of its
/// ids is kept. Its name is found first (fields may come in any order), then its ids are
/// kept while their kind has room.
fn devices(message: Bytes, budget: &mut Budget) -> Result<Option<proto::ContainerDevices>, AnswerError> {
    let mut resource = None;
    each_field(message.clone(), |tag, wire_type, buf| match tag {
        1 => {
            resource = Some(string(wire_type, buf, budget)?);
            Ok(())
        }
        _ => skip(tag, wire_type, buf),
    })?;
    let Some((resource_name, kind)) = resource.and_then(|name| Kind::of_resource(&name).map(|kind| (name, kind)))
    else {
        return Ok(None);
    };
    let mut device_ids = Vec::new();
    each_field(message, |tag, wire_type, buf| match tag {
        2 if budget.take(List::DeviceIds, kind) => {
            device_ids.push(string(wire_type, buf, budget)?);
            Ok(())
        }
        // Past the bound (counted by `take`), an id is stepped over: no copy, no allocation.
        _ => skip(tag, wire_type, buf),
    })?;
    Ok((!device_ids.is_empty()).then_some(proto::ContainerDevices { resource_name, device_ids }))
}

/// A claim of a container; `None` when none of its devices is read and kept.
fn claim(message: Bytes, budget: &mut Budget) -> Result<Option<proto::DynamicResource>, AnswerError> {
    let mut claim = proto::DynamicResource::default();
    each_field(message, |tag, wire_type, buf| {
        match tag {
            2 => claim.claim_name = string(wire_type, buf, budget)?,
            3 => claim.claim_namespace = string(wire_type, buf, budget)?,
            4 => claim.claim_resources.extend(claimed(delimited(wire_type, buf)?, budget)?),
            _ => skip(tag, wire_type, buf)?,
        }
        Ok(())
    })?;
    Ok((!claim.claim_resources.is_empty()).then_some(claim))
}

/// A claim's device; `None` when its driver is not read or its kind has no room left.
fn claimed(message: Bytes, budget: &mut Budget) -> Result<Option<proto::ClaimResource>, AnswerError> {
    let mut device = proto::ClaimResource::default();
    each_field(message, |tag, wire_type, buf| {
        match tag {
            2 => device.driver_name = string(wire_type, buf, budget)?,
            3 => device.pool_name = string(wire_type, buf, budget)?,
            4 => device.device_name = string(wire_type, buf, budget)?,
            _ => skip(tag, wire_type, buf)?,
        }
        Ok(())
    })?;
    let Some(kind) = Kind::of_driver(&device.driver_name) else { return Ok(None) };
    Ok(budget.take(List::ClaimedDevices, kind).then_some(device))
}

/// The pod-resources client's codec: requests encoded by prost, answers read here.
pub struct BoundedCodec<Req, Resp>(PhantomData<(Req, Resp)>);

impl<Req, Resp> Default for BoundedCodec<Req, Resp> {
    fn default() -> Self {
        BoundedCodec(PhantomData)
    }
}

impl<Req, Resp> Codec for BoundedCodec<Req, Resp>
where
    Req: prost::Message + Send + 'static,
    Resp: Decode + Send + 'static,
{
    type Encode = Req;
    type Decode = Bounded<Resp>;
    type Encoder = ProstEncoder<Req>;
    type Decoder = BoundedDecoder<Resp>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(PhantomData)
    }
}

pub struct BoundedDecoder<Resp>(PhantomData<Resp>);

impl<Resp: Decode> Decoder for BoundedDecoder<Resp> {
    type Item = Bounded<Resp>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bounded<Resp>>, tonic::Status> {
        // One copy of the message (at most the client's 16 MiB); its parts are views of it.
        let message = buf.copy_to_bytes(buf.remaining());
        decode(message).map(Some).map_err(|e| tonic::Status::internal(format!("reading the answer: {e}")))
    }
}

#[cfg(test)]
mod tests;

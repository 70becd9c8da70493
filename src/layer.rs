//! The layers of memory a leak test judges, each with its own source and
//! verdict.
use std::fmt;
use tch::Device;

/// How reports and the JSON name a device: `cpu`, `cuda:0`.
pub(crate) fn device_name(device: Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// The inverse of [`device_name`] for the devices a leak test measures.
fn device_from_name(name: &str) -> Option<Device> {
    match name {
        "cpu" => Some(Device::Cpu),
        other => other.strip_prefix("cuda:")?.parse().ok().map(Device::Cuda),
    }
}

/// `tch::Device` in the JSON: its name (`cpu`, `cuda:0`).
pub(crate) mod device_serde {
    use tch::Device;

    pub(crate) fn serialize<S: serde::Serializer>(device: &Device, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::device_name(*device))
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Device, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(deserializer)?;
        super::device_from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("{name:?} is not a device name")))
    }
}

/// One judged layer of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layer {
    /// Tensor memory libtorch allocates on a device: host memory through its
    /// CPU allocator on the CPU (pinned host memory too, in process scope),
    /// device memory through its CUDA allocator on CUDA.
    Tensors(Device),
    /// libtorch's C++ heap on the host: autograd's graph nodes,
    /// saved-variable records, `TensorImpl`s and libtorch's own containers,
    /// counted through operator new. Rust's heap (a `Vec<f64>` of losses) is
    /// not in it.
    HostObjects,
    /// Memory allocated through the CUDA driver by code outside libtorch's
    /// allocators: on a CUDA device (a custom kernel crate's `cuMemAlloc`,
    /// NCCL's buffers, a library's `cudaMalloc`), or pinned host memory on
    /// the CPU (`cudaHostAlloc` outside libtorch's caching host allocator).
    /// Seen through CUPTI's callbacks on the driver's allocation calls.
    OutsideLibtorch(Device),
}

impl Layer {
    /// The device whose memory it is: the CPU for the C++ heap.
    pub fn device(self) -> Device {
        match self {
            Layer::Tensors(device) | Layer::OutsideLibtorch(device) => device,
            Layer::HostObjects => Device::Cpu,
        }
    }

    /// Its name in reports and the JSON: `cpu`, `cuda:0`, `host-objects`,
    /// `outside-libtorch:cuda:0`, `outside-libtorch:cpu`.
    pub fn name(self) -> String {
        match self {
            Layer::Tensors(device) => device_name(device),
            Layer::HostObjects => HOST_OBJECTS.to_string(),
            Layer::OutsideLibtorch(device) => format!("{OUTSIDE_LIBTORCH}:{}", device_name(device)),
        }
    }

    /// The inverse of [`Layer::name`].
    pub fn from_name(name: &str) -> Option<Layer> {
        let device = device_from_name;
        match name {
            HOST_OBJECTS => Some(Layer::HostObjects),
            other => match other.strip_prefix(OUTSIDE_LIBTORCH).and_then(|rest| rest.strip_prefix(':')) {
                Some(rest) => device(rest).map(Layer::OutsideLibtorch),
                None => device(other).map(Layer::Tensors),
            },
        }
    }

    /// The layer in a few words, for a sentence or a legend:
    /// `tensors on cuda:0`, `libtorch's host objects`.
    pub fn plain_name(self) -> String {
        match self {
            Layer::HostObjects => "libtorch's host objects".to_string(),
            Layer::Tensors(device) => format!("tensors on {}", device_name(device)),
            Layer::OutsideLibtorch(device) => format!("driver allocations outside libtorch on {}", device_name(device)),
        }
    }

    /// What memory it is, for a reader.
    pub fn description(self) -> &'static str {
        match self {
            Layer::Tensors(Device::Cpu) => "host memory through libtorch's CPU allocator (tensor storage)",
            Layer::Tensors(_) => "device memory through libtorch's CUDA allocator",
            Layer::HostObjects => {
                "libtorch's host objects: its C++ heap (autograd graph nodes, saved-variable records, TensorImpls)"
            }
            Layer::OutsideLibtorch(Device::Cuda(_)) => {
                "device memory allocated through the CUDA driver outside libtorch's allocators (cuMemAlloc, \
                 cudaMalloc, cuMemCreate from other code)"
            }
            Layer::OutsideLibtorch(_) => {
                "pinned host memory allocated through the CUDA driver outside libtorch's caching host allocator \
                 (cudaHostAlloc, cuMemAllocHost from other code)"
            }
        }
    }
}

const HOST_OBJECTS: &str = "host-objects";
const OUTSIDE_LIBTORCH: &str = "outside-libtorch";

impl From<Device> for Layer {
    fn from(device: Device) -> Layer {
        Layer::Tensors(device)
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl serde::Serialize for Layer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Layer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Layer, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(deserializer)?;
        Layer::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("{name:?} is not a layer name")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layer_reads_back_from_its_name() {
        for layer in [
            Layer::Tensors(Device::Cpu),
            Layer::Tensors(Device::Cuda(3)),
            Layer::HostObjects,
            Layer::OutsideLibtorch(Device::Cuda(1)),
            Layer::OutsideLibtorch(Device::Cpu),
        ] {
            assert_eq!(Layer::from_name(&layer.name()), Some(layer));
        }
        assert_eq!(Layer::from_name("gpu"), None);
        assert_eq!(Layer::from_name("outside-libtorch"), None);
        assert_eq!(Layer::from_name("outside-libtorch:gpu"), None);
        assert_eq!(Layer::HostObjects.device(), Device::Cpu);
    }
}

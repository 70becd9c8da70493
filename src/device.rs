//! Which device a leak test measures, and the per-device lock that keeps leak
//! tests in one process from measuring each other.
use crate::error::{Error, InvalidValue, Result};
use crate::probe::cuda;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, OnceLock};
use tch::Device;

/// The `device` setting before it is resolved against the machine. A
/// `tch::Device` converts into it (`Device::Cuda(1)`, `Device::Cpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DeviceChoice {
    /// The first CUDA device if there is one, else the CPU. With
    /// GPU_LEAK_TEST_REQUIRE_CUDA=1 a machine without CUDA is an error.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// `cuda:N`.
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = InvalidValue;

    fn from_str(text: &str) -> std::result::Result<Self, InvalidValue> {
        use gpu_leak_test_options::rules::DeviceValue;
        Ok(match gpu_leak_test_options::rules::parse_device(text).map_err(InvalidValue::new)? {
            DeviceValue::Auto => DeviceChoice::Auto,
            DeviceValue::Cpu => DeviceChoice::Cpu,
            DeviceValue::Cuda(index) => DeviceChoice::Cuda(index),
        })
    }
}

/// In `gpu-leak-test.yaml`: the text the attribute takes.
impl<'de> serde::Deserialize<'de> for DeviceChoice {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        crate::error::deserialize_text(deserializer, "device")
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl From<Device> for DeviceChoice {
    fn from(device: Device) -> Self {
        match device {
            Device::Cuda(i) => DeviceChoice::Cuda(i),
            _ => DeviceChoice::Cpu,
        }
    }
}

impl DeviceChoice {
    /// The device to measure on this machine. `require_cuda` turns "auto on a
    /// machine without CUDA" into an error.
    pub fn resolve(self, require_cuda: bool) -> Result<Device> {
        match self {
            DeviceChoice::Cpu => Ok(Device::Cpu),
            DeviceChoice::Cuda(index) => cuda::check_device(index).map(|_| Device::Cuda(index)),
            DeviceChoice::Auto if cuda::is_available() => Ok(Device::Cuda(auto_cuda_index(cuda::device_count()))),
            DeviceChoice::Auto if require_cuda => cuda::check_device(0).map(|_| Device::Cuda(0)),
            DeviceChoice::Auto => Ok(Device::Cpu),
        }
    }

    /// Whether a test with this choice may start CUDA on this machine, told
    /// without starting it (which takes libtorch's CUDA library and the
    /// driver: hundreds of milliseconds, in a process that may measure
    /// nothing). A wrong yes costs a wait, never a verdict.
    pub(crate) fn may_start_cuda(self) -> bool {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        self.may_start_cuda_where(visible.as_deref(), cuda::nvidia_driver_present())
    }

    /// [`DeviceChoice::may_start_cuda`]'s rule: not on the CPU, not where
    /// `CUDA_VISIBLE_DEVICES` hides every device, and only with NVIDIA's
    /// driver present.
    fn may_start_cuda_where(self, cuda_visible_devices: Option<&str>, driver_present: bool) -> bool {
        let all_hidden = cuda_visible_devices.is_some_and(|v| matches!(v.trim(), "" | "-1" | "NoDevFiles"));
        self != DeviceChoice::Cpu && !all_hidden && driver_present
    }
}

/// The CUDA device `auto` picks on a machine with `count` devices: under
/// cargo nextest, where every test is a process of its own, the test's slot
/// number (`NEXTEST_TEST_GLOBAL_SLOT`) modulo the count, so a runner's tests
/// spread over all its GPUs; else the first device.
fn auto_cuda_index(count: usize) -> usize {
    let slot = std::env::var("NEXTEST_TEST_GLOBAL_SLOT").ok().and_then(|s| s.trim().parse::<usize>().ok());
    spread(slot, count)
}

fn spread(slot: Option<usize>, count: usize) -> usize {
    match slot {
        Some(slot) if count > 1 => slot % count,
        _ => 0,
    }
}

/// True for the errors that mean "this machine has no such CUDA device",
/// which skip a test unless CUDA is required.
pub fn is_missing_device(error: &Error) -> bool {
    matches!(error, Error::NoCudaDevice { .. } | Error::NoSuchCudaDevice { .. })
}

/// Serialises leak tests per device within the process: the allocator and
/// driver views are per device, and a second test would move them.
pub fn lock_device(device: Device) -> MutexGuard<'static, ()> {
    static LOCKS: OnceLock<Mutex<HashMap<String, &'static Mutex<()>>>> = OnceLock::new();
    let lock: &'static Mutex<()> = {
        let mut locks = LOCKS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(format!("{device:?}")).or_insert_with(|| Box::leak(Box::new(Mutex::new(()))))
    };
    // A test that panicked while holding the lock has released it by
    // unwinding; its poison says nothing about the next test.
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_spreads_nextest_slots_over_every_gpu_and_keeps_cuda_0_otherwise() {
        assert_eq!((0..6).map(|slot| spread(Some(slot), 2)).collect::<Vec<_>>(), [0, 1, 0, 1, 0, 1]);
        assert_eq!(spread(Some(7), 8), 7);
        assert_eq!(spread(Some(5), 1), 0, "one GPU");
        assert_eq!(spread(None, 8), 0, "not under nextest");
    }

    #[test]
    fn a_cpu_test_hidden_devices_or_no_driver_never_wait_for_a_cuda_turn() {
        assert!(DeviceChoice::Auto.may_start_cuda_where(None, true));
        assert!(DeviceChoice::Cuda(1).may_start_cuda_where(Some("0,1"), true));
        assert!(!DeviceChoice::Cpu.may_start_cuda_where(None, true));
        assert!(!DeviceChoice::Auto.may_start_cuda_where(None, false), "no NVIDIA driver");
        for hidden in ["", "-1", " -1 ", "NoDevFiles"] {
            assert!(!DeviceChoice::Auto.may_start_cuda_where(Some(hidden), true), "{hidden:?}");
        }
    }

    #[test]
    fn parsing() {
        assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceChoice::Cuda(3)));
        let err = "gpu".parse::<DeviceChoice>().unwrap_err();
        assert!(err.contains("\"gpu\"") && err.contains("cuda:N"), "{err}");
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
    }
}

//! The executor: runs the body's calls (setup, warm-up, measured,
//! confirmation and attribution iterations), turns a panic or an error
//! into the verdict that stops the run, and takes a sample after each.
use super::judge::Judge;
use super::probes::Probes;
use super::samples::Samples;
use super::TestIdentity;
use crate::config::Settings;
use crate::probe::Snapshot;
use crate::report::notes::Note;
use crate::report::HarnessTime;
use crate::verdict::{self, Phase, Verdict};
use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// How often a long run says on stderr where it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// A long confirmation reads what is free (`/proc/meminfo`, the driver) at
/// most this often per layer; in between, what the layer grew since is
/// taken off the last reading.
const FREE_MEMORY_EVERY: Duration = Duration::from_millis(20);
/// Confirmation asks the layers' shapes about this many times per doubling
/// of the iterations run, once past this many (see `run_window`).
const SHAPE_CHECKS: u32 = 64;

/// What was free where a layer lives when last read: when, the bytes, and
/// the layer's level then.
type FreeReading = (Instant, u64, i64);

/// The body's iteration, as `setup` returned it.
pub(super) type Iteration<'i> = dyn FnMut() -> std::result::Result<(), String> + 'i;

/// One run's calls of the body and its samples.
pub(super) struct Executor<'a> {
    pub(super) test: &'a TestIdentity,
    pub(super) settings: &'a Settings,
    pub(super) probes: Probes,
    pub(super) samples: Samples,
    /// Where the time went so far.
    pub(super) time: HarnessTime,
    pub(super) notes: Vec<Note>,
    /// When the run last said it is alive.
    last_progress: Instant,
    /// By layer: see [`FREE_MEMORY_EVERY`].
    free_memory: HashMap<usize, FreeReading>,
}

impl<'a> Executor<'a> {
    pub(super) fn new(test: &'a TestIdentity, settings: &'a Settings, probes: Probes) -> Executor<'a> {
        let samples = Samples::new(probes.levels_now());
        Executor {
            test,
            settings,
            probes,
            samples,
            time: HarnessTime::default(),
            notes: Vec::new(),
            last_progress: Instant::now(),
            free_memory: HashMap::new(),
        }
    }

    /// Runs one call of user code, turning a panic or an error into the
    /// verdict that stops the test.
    pub(super) fn call<T>(
        &mut self,
        phase: Phase,
        iteration: u32,
        f: impl FnOnce() -> std::result::Result<T, String>,
    ) -> std::result::Result<T, Verdict> {
        let ooms_before = self.probes.tracker.out_of_memory().0;
        let started = Instant::now();
        // The body's Rust allocations are the test's; the harness's around
        // them are not (see layer::rust_heap).
        let outcome = crate::layer::rust_heap::as_test(|| crate::probe::stacks::stop_walks_here(|| catch_unwind(AssertUnwindSafe(f))));
        if phase != Phase::Attribution {
            self.time.body += started.elapsed();
        }
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(Verdict::BodyError { phase, iteration, message }),
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                // The views at the moment of failure go into the report.
                let snapshot = self.sample(phase, iteration);
                self.samples.after = Some(snapshot);
                if is_out_of_memory(&message) || self.probes.tracker.out_of_memory().0 > ooms_before {
                    Err(Verdict::OutOfMemory { phase, iteration, message })
                } else {
                    Err(Verdict::Panicked { phase, iteration, message })
                }
            }
        }
    }

    /// One call of the iteration, then its sample.
    pub(super) fn iterate(&mut self, phase: Phase, i: u32, iteration: &mut Iteration<'_>) -> std::result::Result<(), Verdict> {
        self.call(phase, i, &mut *iteration)?;
        self.sample(phase, i);
        Ok(())
    }

    /// Takes one sample, and says where a long run is.
    pub(super) fn sample(&mut self, phase: Phase, iteration: u32) -> Snapshot {
        let started = Instant::now();
        let host_heap = self.reads_host_heap(phase, iteration);
        let (reading, snapshot) = self.probes.read(phase, iteration, host_heap, &mut self.time.sampling_parts);
        if self.last_progress.elapsed() >= PROGRESS_EVERY {
            self.last_progress = Instant::now();
            eprintln!(
                "gpu-leak-test: `{}` still running: {phase} iteration {iteration}, {} live on {}",
                self.test.name,
                crate::report::bytes(reading.levels[self.probes.body].max(0) as u64),
                crate::layer::device_name(self.probes.device)
            );
        }
        self.samples.push(reading);
        self.time.sampling += started.elapsed();
        snapshot
    }

    /// Whether the sample after `iteration` of `phase` reads the host heap:
    /// the measured window's baseline (the last warm-up, or setup) and every
    /// [`verdict::host_heap_spacing`]-th iteration of the window and of
    /// confirmation; attribution's few, always.
    fn reads_host_heap(&self, phase: Phase, iteration: u32) -> bool {
        let spacing = verdict::host_heap_spacing(self.settings.iterations);
        match phase {
            Phase::WarmUp => iteration == self.settings.warmup || iteration % spacing == 0,
            Phase::Measure | Phase::Confirm => iteration % spacing == 0,
            Phase::Setup | Phase::Attribution => true,
        }
    }

    /// Every view of the body's device now, the driver's too, timed as
    /// sampling; the driver's part is timed apart as well.
    pub(super) fn snapshot_now(&mut self) -> Snapshot {
        let started = Instant::now();
        let snapshot = self.probes.snapshot(true);
        let asked_driver = Instant::now();
        let snapshot = snapshot.with_driver_views();
        self.time.sampling_parts.driver += asked_driver.elapsed();
        self.time.sampling += started.elapsed();
        snapshot
    }

    /// Tells the judge which layers were used so far.
    pub(super) fn update_used(&self, judge: &mut Judge) {
        let used = (0..self.probes.counted.len()).map(|d| self.probes.used(d, self.samples.moved(d))).collect();
        judge.set_used(used);
    }

    /// Warm-up, the measured iterations, and the confirmation iterations
    /// where the window cannot tell a leak from growth that stops.
    pub(super) fn run_window(&mut self, iteration: &mut Iteration<'_>, judge: &mut Judge) -> std::result::Result<(), Verdict> {
        let settings = self.settings;
        for i in 1..=settings.warmup {
            self.iterate(Phase::WarmUp, i, iteration)?;
        }
        self.samples.before = Some(self.snapshot_now());
        for i in 1..=settings.iterations {
            self.iterate(Phase::Measure, i, iteration)?;
        }
        let mut n = settings.iterations;
        let bound = verdict::confirmation_bound(settings.iterations);
        loop {
            // Asking reads each layer's whole history, so once the run is
            // past SHAPE_CHECKS iterations it asks only every
            // n / SHAPE_CHECKS-th: a long window's confirmation costs the
            // same per iteration as a short one's, for at most that share
            // of iterations more (the memory budget is still asked every
            // iteration).
            let stride = (n / SHAPE_CHECKS).max(1);
            if (n - settings.iterations) % stride == 0 || n >= bound {
                self.update_used(judge);
                // Once a layer is a certain leak the test fails whatever
                // else grows; the other layers are decided on the
                // iterations run.
                if judge.window_decided(&self.samples) {
                    break;
                }
            }
            if let Some(note) = self.next_iteration_could_exhaust(judge, n - settings.iterations) {
                self.notes.push(note);
                break;
            }
            n += 1;
            self.iterate(Phase::Confirm, n, iteration)?;
        }
        Ok(())
    }

    /// Where one more iteration could run the machine out of memory: a
    /// judged layer whose latest iteration grew by more than a share of
    /// what is free where it lives (the device, or the host).
    fn next_iteration_could_exhaust(&mut self, judge: &Judge, confirmed: u32) -> Option<Note> {
        judge.judged().into_iter().find_map(|d| {
            let growth = self.samples.latest_growth(d).filter(|&g| g > 0)?;
            let level = *self.samples.levels.last()?.get(d)?;
            let layer = self.probes.layer(d);
            let free = match self.free_memory.get(&d) {
                Some(&(read_at, free, then)) if read_at.elapsed() < FREE_MEMORY_EVERY => {
                    free.saturating_sub((level - then).max(0) as u64)
                }
                _ => {
                    let free = match layer.device() {
                        tch::Device::Cuda(index) => crate::probe::cuda::driver_memory(index).ok().map(|m| m.free_bytes),
                        _ => crate::probe::host::available_bytes(),
                    }?;
                    self.free_memory.insert(d, (Instant::now(), free, level));
                    free
                }
            };
            verdict::next_iteration_could_exhaust(growth, free).then_some(Note::ConfirmationStopped {
                after: confirmed,
                layer,
                grew: growth as u64,
                free,
            })
        })
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

/// libtorch's messages for failed allocations, CUDA and CPU.
fn is_out_of_memory(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("out of memory") || m.contains("defaultcpuallocator: can't allocate memory")
}

//! Gain and phase margins of PID-Delay on the linearised fluid model of paper 004 §III.
//!
//! Paper eq. 18 as printed mixes symbols (α/T, Nβ/S, γ) whose meaning it does not define and is
//! not dimensionally consistent, so the loop is rebuilt from the paper's eqs. 15–17 (decision
//! P10): the window/queue plant of eqs. 15–16,
//!
//!   q(s)/p(s) = −(C²/2N)·e^{−sR} / ((s + 1/R)(s + N(1 + e^{−sR})/(R²C))),
//!
//! with the controller acting on the delay o = q/C (eq. 1–2) through the positional equivalent
//! of eq. 5 sampled every T: C_PID(s) = Kp + Ki/(T·s) + Kd·T·s, times e^{−sT/2} for the sample
//! and hold. The open loop is L(s) = C_PID(s)·e^{−sT/2}·(C/2N)·e^{−sR}/((s + 1/R)(s + N(1 +
//! e^{−sR})/(R²C))); the minus sign is the negative feedback. C in packets/s, R in s.

use crate::PidDelayParams;

/// The linearisation point.
#[derive(Debug, Clone, Copy)]
pub struct OperatingPoint {
    /// Bottleneck capacity, packets per second.
    pub capacity_pps: f64,
    /// Number of long-lived flows.
    pub flows: f64,
    /// Round-trip time at the operating point (propagation + τ0), seconds.
    pub rtt: f64,
}

/// Stability margins of the open loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margins {
    /// Frequency where |L| = 1, rad/s.
    pub gain_crossover: Option<f64>,
    /// 180° + arg L at the gain crossover, degrees (negative: the closed loop is unstable).
    pub phase_margin_deg: Option<f64>,
    /// Frequency where arg L = −180°, rad/s.
    pub phase_crossover: Option<f64>,
    /// −20·log10 |L| at the phase crossover, dB (negative: unstable).
    pub gain_margin_db: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
struct Cx(f64, f64);

impl Cx {
    fn abs(self) -> f64 {
        self.0.hypot(self.1)
    }
    fn arg(self) -> f64 {
        self.1.atan2(self.0)
    }
}

/// |L(jω)| and arg L(jω) (radians, continuous in ω) for gains scaled by `scale` (Z1, Z2, Z3
/// or 1).
pub fn open_loop(p: &PidDelayParams, op: &OperatingPoint, scale: f64, w: f64) -> (f64, f64) {
    let t = p.period.as_secs_f64();
    let (c, n, r) = (op.capacity_pps, op.flows, op.rtt);
    // C_PID(jω) = Kp + Ki/(jωT) + Kd·T·jω
    let pid = Cx(scale * p.kp, scale * (p.kd * t * w - p.ki / (t * w)));
    let a = n / (r * r * c);
    // jω + a(1 + e^{−jωR}) = a(1 + cos ωR) + j(ω − a·sin ωR): real part ≥ 0, so its argument
    // stays in (−π/2, π/2] and the phase below is continuous.
    let pole2 = Cx(a * (1.0 + (w * r).cos()), w - a * (w * r).sin());
    let pole1 = Cx(1.0 / r, w);
    let mag = pid.abs() * (c / (2.0 * n)) / (pole1.abs() * pole2.abs());
    let mut pid_arg = pid.arg();
    if pid_arg > 0.0 && w < (p.ki / (p.kd * t * t)).sqrt() {
        pid_arg -= 2.0 * std::f64::consts::PI; // keep the integral's −90° side continuous
    }
    let phase = pid_arg - w * r - w * t / 2.0 - pole1.arg() - pole2.arg();
    (mag, phase)
}

impl OperatingPoint {
    /// The drop probability at which N Reno-like flows fill this link (the fluid model's
    /// equilibrium, p0 = 2N²/(R²C²), at most 1).
    pub fn equilibrium_drop_probability(&self) -> f64 {
        let (n, r, c) = (self.flows, self.rtt, self.capacity_pps);
        (2.0 * n * n / (r * r * c * c)).min(1.0)
    }
}

/// The factor the gains are multiplied by at `op`: 1 for the paper's scheme; for a controller
/// that auto-scales (decision P11), PIE's factor at the equilibrium drop probability.
pub fn gain_scale(p: &PidDelayParams, op: &OperatingPoint) -> f64 {
    if p.auto_scale {
        gain_scale_at(op.equilibrium_drop_probability())
    } else {
        1.0
    }
}

/// PIE's auto-scaling factor when the drop probability is `u`.
pub fn gain_scale_at(u: f64) -> f64 {
    crate::pie::auto_tune_scale(u)
}

/// Find the margins by scanning ω from 10⁻³ to 10⁴ rad/s and refining each crossing.
pub fn margins(p: &PidDelayParams, op: &OperatingPoint, scale: f64) -> Margins {
    let steps = 40_000;
    let w_at = |i: usize| 10f64.powf(-3.0 + 7.0 * i as f64 / steps as f64);
    let pi = std::f64::consts::PI;
    let mut out = Margins {
        gain_crossover: None,
        phase_margin_deg: None,
        phase_crossover: None,
        gain_margin_db: None,
    };
    let mut prev = open_loop(p, op, scale, w_at(0));
    for i in 1..=steps {
        let (w0, w1) = (w_at(i - 1), w_at(i));
        let cur = open_loop(p, op, scale, w1);
        if out.gain_crossover.is_none() && prev.0 >= 1.0 && cur.0 < 1.0 {
            let w = bisect(w0, w1, |w| open_loop(p, op, scale, w).0 - 1.0);
            out.gain_crossover = Some(w);
            out.phase_margin_deg = Some((open_loop(p, op, scale, w).1 + pi).to_degrees());
        }
        if out.phase_crossover.is_none() && prev.1 > -pi && cur.1 <= -pi {
            let w = bisect(w0, w1, |w| open_loop(p, op, scale, w).1 + pi);
            out.phase_crossover = Some(w);
            out.gain_margin_db = Some(-20.0 * open_loop(p, op, scale, w).0.log10());
        }
        prev = cur;
    }
    out
}

fn bisect(mut lo: f64, mut hi: f64, f: impl Fn(f64) -> f64) -> f64 {
    let sign_lo = f(lo) > 0.0;
    for _ in 0..80 {
        let mid = (lo * hi).sqrt();
        if (f(mid) > 0.0) == sign_lo {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo * hi).sqrt()
}

/// The largest factor k such that gains k·(Kp, Ki, Kd) keep a phase margin of at least
/// `pm_deg` (searched over 10⁻⁴…10).
pub fn max_gain_scale(p: &PidDelayParams, op: &OperatingPoint, pm_deg: f64) -> Option<f64> {
    // No gain crossover in the scanned band: |L| < 1 there, the most stable case.
    let ok = |k: f64| {
        margins(p, op, k)
            .phase_margin_deg
            .is_none_or(|pm| pm >= pm_deg)
    };
    let (mut lo, mut hi) = (1e-4, 10.0);
    if !ok(lo) {
        return None;
    }
    if ok(hi) {
        return Some(hi);
    }
    for _ in 0..40 {
        let mid = (lo * hi).sqrt();
        if ok(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paper_point() -> OperatingPoint {
        OperatingPoint {
            capacity_pps: 10e6 / (1440.0 * 8.0),
            flows: 10.0,
            rtt: 0.107,
        }
    }

    #[test]
    fn open_loop_matches_a_hand_calculation() {
        // ω = 10 rad/s at the paper point, scale 1: evaluated by hand from the formula.
        let p = PidDelayParams::default();
        let op = paper_point();
        let (mag, _) = open_loop(&p, &op, 1.0, 10.0);
        let (c, n, r, t) = (op.capacity_pps, 10.0f64, 0.107f64, 0.015f64);
        let pid = (1.3125f64.powi(2) + (0.125 * t * 10.0 - 1.25 / (t * 10.0)).powi(2)).sqrt();
        let a = n / (r * r * c);
        let p2 =
            ((a * (1.0 + (10.0 * r).cos())).powi(2) + (10.0 - a * (10.0 * r).sin()).powi(2)).sqrt();
        let p1 = ((1.0 / r).powi(2) + 100.0).sqrt();
        assert!((mag - pid * c / (2.0 * n) / (p1 * p2)).abs() < 1e-9);
    }

    /// The operating points of `qgate-lab aqm` (lab/plans/paper004-aqm.toml): 10 Mbit/s, 10
    /// flows, 50 + 1 ms; 50 Mbit/s, 30 flows, 20 + 1 ms; 5 Mbit/s, 5 flows, 100 + 1 ms; R
    /// includes the stable variant's τ0.
    fn lab_points(target_s: f64) -> [OperatingPoint; 3] {
        [(10.0, 10.0, 0.051), (50.0, 30.0, 0.021), (5.0, 5.0, 0.101)].map(|(mbps, n, d)| {
            OperatingPoint {
                capacity_pps: mbps * 1e6 / (1440.0 * 8.0),
                flows: n,
                rtt: 2.0 * d + target_s,
            }
        })
    }

    #[test]
    fn the_stable_variant_keeps_its_phase_margin_at_the_lab_points() {
        let p = PidDelayParams::stable();
        for op in lab_points(p.target.as_secs_f64()) {
            let m = margins(&p, &op, gain_scale(&p, &op));
            let pm = m.phase_margin_deg.expect("a gain crossover");
            assert!(pm >= crate::STABLE_PHASE_MARGIN_DEG, "{op:?}: {pm}°");
            assert!(m.gain_margin_db.is_none_or(|g| g > 0.0), "{op:?}: {m:?}");
        }
        // Twice the gains lose the margin somewhere: the design is not slack everywhere.
        let doubled = PidDelayParams {
            kp: 2.0 * p.kp,
            ki: 2.0 * p.ki,
            ..p
        };
        let worst = lab_points(p.target.as_secs_f64())
            .iter()
            .map(|op| {
                margins(&doubled, op, gain_scale(&doubled, op))
                    .phase_margin_deg
                    .unwrap_or(180.0)
            })
            .fold(f64::INFINITY, f64::min);
        assert!(worst < crate::STABLE_PHASE_MARGIN_DEG, "{worst}");
    }

    #[test]
    fn table_ii_gains_are_unstable_at_the_papers_point() {
        let p = PidDelayParams::default();
        let op = lab_points(p.target.as_secs_f64())[0];
        assert_eq!(gain_scale(&p, &op), 1.0);
        assert!(margins(&p, &op, 1.0).phase_margin_deg.unwrap() < 0.0);
    }

    #[test]
    fn smaller_gains_give_more_margin() {
        let p = PidDelayParams::default();
        let op = paper_point();
        let k = max_gain_scale(&p, &op, 45.0).expect("some gain is stable");
        let m = margins(&p, &op, k * 0.5);
        assert!(m.phase_margin_deg.unwrap() > 45.0);
        assert!(m.gain_margin_db.unwrap() > 0.0);
        // Gain margin shrinks as gains grow.
        let a = margins(&p, &op, k * 0.25).gain_margin_db.unwrap();
        let b = margins(&p, &op, k * 0.5).gain_margin_db.unwrap();
        assert!(
            a > b && (a - b - 20.0 * 2f64.log10()).abs() < 0.5,
            "{a} {b}"
        );
    }
}

#!/usr/bin/python3
"""Linux's own NTB stack on the simulated NTB: two TCG VMs (lenderhost.LenderHost, Debian's
kernel with an IOMMU) joined by vfio-ntb-ntbsim, each with its NTB function as a vfio-user
device.  In each, Linux's unmodified ntb_hw_epf binds and its clients run (ntb_inner.py
says what each host does).  What a user would check:

- ntb-linux-clients: ntb_hw_epf bound in both hosts, each NTB function in an IOMMU DMA
  domain; ntb_tool: the link up in both, each host's scratchpad write seen by the other,
  each host's doorbell rung by the other, 4 KiB written through each host's window landing
  in the buffer the other host allocated for it (and read back through the window);
  ntb_pingpong bounced at least 10 times each way; ntb_perf copied through the window and
  printed its throughput.
- ntb-kmod: our module (vfio-ntb/kmod/) on the same pair (ntb_kmod.py): each host's window
  mmap'd and written both ways, and seen through a file of that window alone (VN_NTB_MW_FD),
  one host's target its own pinned pages (export through its IOMMU), the other's a buffer
  of the module's; doorbells as eventfds, and an eventfd of host a's that rings host b's
  doorbell in the kernel (and rings nothing once removed); a table of bad arguments each
  refused with its errno; the module unloads once the device is closed; when host a's VM
  is killed (ntb-peer-lost), b's link goes down within 1 s, its window reads all ones, and
  the module unloads there too.
- ntb-fabric: the `ntb` fabric backend over our module (ntb_fabric.py): host a's fabric
  requests answered by host b through message rings in the simulated NTB's window, in two
  sessions (each a new opening of the device), timed against the `shm` backend between two
  processes of host a (ABBA rounds); in each, a 16 KiB segment of b's mapped by a through
  a window (the NTB's second: b's pinned pages), read and written both ways.  The numbers are also the bench line ntb-message-rtt,
  left in build/artifacts/ntb-message-rtt.json for bench/run-bench.  Then vfio-ntbd itself
  with `fabric = ntb` in both hosts: each lists the other's link up (`ntbctl nodes`).
- ntb-lend: host a's NVMe (vfio-pci, host a's IOMMU) lent through the `ntb` backend to
  host b, used there by a qtest QEMU (ntb_lend.py): config space and BAR0's CAP as sysfs
  showed them, Identify (the device's DMA through host a's window into the consumer's RAM
  behind host b's window), Identify by MSI-X (through a doorbell route: host a's device
  rings host b's doorbell in the kernel, nothing relayed), no BAR access
  forwarded or served by software: the consumer's BAR is host b's window onto the device,
  reached peer to peer (the simulated NTB counts those accesses).
- mem-disable-under-load, flr-under-load: the BAR guard (ntb_lend.guard_under_load): a
  thread of host b's reads BAR0 through a window file onto it while the consumer clears
  COMMAND.MEM, sets it again, then asks for an FLR; it reads all ones while memory decode is
  off, CAP again after, the lender withheld its translation each time, and no access of its
  reached a BAR that did not decode (the simulated NTB's failed peer-to-peer accesses: 0).
- fence-lender-worker-killed-ntb: host a's lender worker stopped (SIGSTOP) and the lease
  revoked meanwhile: host a's daemon fences without it: host b's old consumer reads all ones
  while that worker is still there, the worker is killed when it does not say it fenced,
  and a new borrow of host b's finds the device reset (CC, enabled when the old holder
  left it, reads 0) and passes Identify on it.
- ntb-daemon-restart (ntb_restart.py): host a's NVMe lent to host b's consumer, which ran an
  Identify by MSI-X; host a's daemon killed and started again, then host b's: each took its
  port's session over (kept by our module, VN_NTB_KEEP) and adopted its worker, the other
  heard of it (RESUMED) and no new session started; the consumer's Identify by MSI-X passed
  after each restart with MSI-X as it was (the doorbell route kept), and again once both
  daemons' workers had had their time to claim what they hold (nothing withdrawn); nothing
  forwarded or relayed.  Then host a's daemon away longer than the port keeps its session
  (keep-ms 6 s): host b reports the device lost once the link is down (not after the lease
  timeout), the consumer's BAR reads all ones, and host a's restarted daemon lists the
  device free: both hosts agree.
- ntb-impersonation-refused (ntb_impersonate.py; every daemon here holds the link's key,
  [fabric] key-file): host b's daemon borrows host a's NVMe and is killed; a config whose
  port does not name its node is refused by --check-config; a daemon on host b's port that
  names itself hostb without the key is refused by host a at each session (logged, hostb
  listed down, the lease still hostb's) and never sees hosta up; the real hostb, back, is
  linked again, still holds the lease and returns it.
- ntb-modules-6.12: our module and Linux's NTB stack also build for Debian's 6.12 kernel
  (Debian 13's series, which Debian 12 carries too), the newest the archive has.
- ntb-peer-lost: the device lent again and in use by host b's consumer when host a's VM is
  killed (ntb_lend.peer_lost): the consumer's BAR reads all ones within seconds, host b's
  borrower reports the lender lost as soon as the link is down (the data path went with the
  NTB session), the consumer and host b's VM keep running, the device is given back.  (ntb-kmod takes the link's fall from it: host b's
  daemon sees it within 1 s, and the module on its own reads it down, the window all ones,
  and unloads.)
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from lenderhost import NVME, LenderHost  # noqa: E402
import ntb_guest  # noqa: E402

EXPECTED_RESULTS = 11
# The hosts on the patched QEMU (test_ntb_patched.py sets it).
PATCHED = False
# Two TCG VMs at once, ntb_perf's trapped copy; tests/run-checks reads this.
TIMEOUT_S = 1200
NTBSIM = h.REPO / "build" / "vfio-ntb-ntbsim"
# Each window: room for the consumer's RAM of ntb-lend (ntb_lend.RAM_SIZE) as one segment.
WINDOW_MIB = 64
# ntb-guest-data (test_ntb_patched.py sets it): a guest of host b's on the lent NVMe
# (ntb_guest.py), its RAM through one window of ntb_guest.GUEST_MIB, one more nested boot.
GUEST_DATA = False


def facts(lines):
    """The FACT lines of an inner script's output, as one dict."""
    out = {}
    for ln in lines:
        if ln.startswith("FACT "):
            out.update(kv.split("=", 1) for kv in ln.split()[1:] if "=" in kv)
        elif ln.strip():
            print(f"  {ln}", file=sys.stderr)
    return out


def hosts_facts(hosts, killed=()):
    """Each host's FACTs once it finished (what it printed until then when it did not, with
    the reason as its error, unless it is one of @killed: the test ended it)."""
    seen = {}
    for r, lh in hosts.items():
        try:
            seen[r] = facts(lh.finish())
        except (h.HarnessError, TimeoutError, OSError) as e:
            seen[r] = facts(lh.out.read_text().splitlines()) if lh.out.exists() else {}
            if r not in killed:
                print(f"host {r}: {e}", file=sys.stderr)
                seen[r].setdefault("error", str(e).splitlines()[0][:100])
    return seen


def serve_stats_requests(share, sim, stats):
    """A host's request for the simulated NTB's counters now (ntb_lend.ntbsim_counters): a
    file stats-request-NAME in the share, answered with stats-NAME.json."""
    for req in share.glob("stats-request-*"):
        name = req.name[len("stats-request-"):]
        stats.unlink(missing_ok=True)
        os.kill(sim.pid, signal.SIGUSR1)
        if h.wait_for(stats.exists, 5):
            time.sleep(0.1)                     # written whole
            tmp = share / f".stats-{name}.json"
            shutil.copy(stats, tmp)
            tmp.rename(share / f"stats-{name}.json")
        req.unlink(missing_ok=True)


def start_ntbsim(procs, run, windows, window_mib, *more):
    """vfio-ntb-ntbsim with @windows windows of @window_mib MiB (its --window-mib) on the
    sockets run/p0 and run/p1, its counters in run/stats.json, its log in run/ntbsim.log;
    None when it did not listen.  The log has each port's connections, resets and link
    requests and the link's changes (what a failed run is read by)."""
    env = dict(os.environ, G_MESSAGES_DEBUG="vfio-ntb.simdev vfio-ntb.vfio-user")
    log = open(run / "ntbsim.log", "wb")        # GLib writes info and debug on stdout
    sim = procs.start("ntbsim", [NTBSIM, "--port0", run / "p0", "--port1", run / "p1",
                                 "--windows", str(windows), "--window-mib", str(window_mib),
                                 "--stats-file", run / "stats.json", *more],
                      stdout=log, stderr=log, env=env)
    if not h.wait_for(lambda: (run / "p0").exists() and (run / "p1").exists(), 10):
        return None
    return sim


def model_log(path, lines=40):
    """The simulated NTB's own lines (connections, resets, link), the last @lines of them, on
    stderr: what a failed run in CI shows of the model."""
    said = [ln for ln in path.read_text(errors="replace").splitlines()
            if "NTB model" in ln or "socket " in ln and "client DMA" not in ln] if path.exists() else []
    print("ntbsim said (last %d of %d):" % (min(lines, len(said)), len(said)), file=sys.stderr)
    for ln in said[-lines:]:
        print(f"  {ln}", file=sys.stderr)


def device(socket):
    return json.dumps({"driver": "vfio-user-pci", "id": "ntb0",
                       "socket": {"type": "unix", "path": str(socket)}})


def newest_612():
    """The newest Debian 6.12 kernel release Debian 12's archive has (6.12 is Debian 13's
    kernel series; Debian 12 carries it as +deb12)."""
    out = subprocess.run(["apt-cache", "search", "--names-only",
                          r"^linux-headers-6\.12\.[0-9]+\+deb12-amd64$"],
                         capture_output=True, text=True, check=True).stdout
    rels = [ln.split()[0][len("linux-headers-"):] for ln in out.splitlines() if ln.strip()]
    if not rels:
        raise h.HarnessError("the archive has no linux-headers-6.12.*+deb12-amd64")
    return max(rels, key=lambda r: [int(x) for x in r.split("+")[0].split(".")])


def modules_612():
    """Our module and Linux's NTB stack built for Debian's 6.12 kernel as well (its
    headers and source fetched into the cache); the test VMs run 6.1."""
    try:
        rel = newest_612()
        d = Path(h._script_output("build-ntb-modules", "--release", rel))
        kos = sorted(p.name for p in d.glob("*.ko"))
        magic = subprocess.run(["modinfo", "-F", "vermagic", str(d / "vfio_ntb.ko")],
                               capture_output=True, text=True).stdout.split()
    except (h.HarnessError, OSError, subprocess.SubprocessError) as e:
        return h.failed("ntb-modules-6.12", e)
    return h.result("ntb-modules-6.12", "vfio_ntb.ko" in kos and "ntb_hw_epf.ko" in kos and
                    magic[:1] == [rel], release=rel, modules=len(kos),
                    vermagic=magic[0] if magic else "-")


def main():
    ok = modules_612()
    with h.Procs() as procs:
        try:
            mods = h._script_output("build-ntb-modules")
            if GUEST_DATA:
                h.testbed_guest()       # the nested guest's image, built here (read-only there)
        except Exception as e:          # noqa: BLE001 (any failure is this test's)
            return h.failed("ntb-linux-clients", e)
        share = procs.tempdir("vn-ntb-share-")
        run = procs.tempdir("vn-ntbsim-")
        stats = run / "stats.json"
        window_mib = ntb_guest.GUEST_MIB if GUEST_DATA else WINDOW_MIB
        sim = start_ntbsim(procs, run, 2, window_mib, "--trace", "server_client_dma")
        if sim is None:
            return h.result("ntb-linux-clients", False, error="ntbsim did not listen")
        # Host a has the NVMe it lends (ntb_lend.py); host b a device whose BAR its module
        # exports (ntb_kmod.device_memory_exports).
        # The hosts on Debian's QEMU, which traps every window access; on the patched one
        # (test_ntb_patched.py), whose windows ntbsim maps where they reach RAM.
        qemu = h.patched_qemu() if PATCHED else None
        # VN_NTB_ONLY=guest: that phase alone (a quicker run while changing it).
        only = GUEST_DATA and os.environ.get("VN_NTB_ONLY") == "guest"
        args = ("--modules", mods) + (("--guest-data",) if GUEST_DATA else ()) + \
            (("--guest-only",) if only else ())
        hosts = {r: LenderHost(procs, "ntb_inner.py", args=args,
                               devices=(NVME,) if r == "a" else ("pci-testdev",),
                               share=share, role=r, raw_devices=[device(run / f"p{i}")],
                               memfd=True, mem_mib=1024, timeout=900 + GUEST_DATA * 900,
                               qemu=qemu)
                 for i, r in enumerate("ab")}
        for lh in hosts.values():
            lh.start()
        # Host b asks for host a's VM to be killed (the peer lost, as a crash loses it).
        deadline = time.monotonic() + 900 + GUEST_DATA * 900
        while not (share / "kill-a").exists() and time.monotonic() < deadline and \
                all(lh.proc.poll() is None for lh in hosts.values()):
            serve_stats_requests(share, sim, stats)
            time.sleep(0.1)
        if (share / "kill-a").exists():
            hosts["a"].proc.kill()
            (share / "killed-a").write_text("")
        # Host a is killed: what it printed until then is its part.
        seen = hosts_facts(hosts, killed=("a",) if (share / "kill-a").exists() else ())
        # What the guest of ntb-guest-data wrote, read back from host a's disk while the
        # share is still there.
        disk_check = verify_guest_regions(seen["b"], share / "nv0.img") if GUEST_DATA else []
        os.kill(sim.pid, signal.SIGUSR1)
        h.wait_for(stats.exists, 5)
        counters = json.loads(stats.read_text()) if stats.exists() else {}
        procs.stop(sim)
        # For a person: what the simulated NTB and each host said.
        logs = h.REPO / "build" / "artifacts" / "ntb-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for f in [run / "ntbsim.log", run / "stats.json", *share.glob("inner-*.log"), *share.glob("qemu-*.log")]:
            if f.exists():
                shutil.copy(f, logs / f.name)
        if any("error" in s for s in seen.values()):
            model_log(run / "ntbsim.log")
    a, b = seen["a"], seen["b"]
    p0, p1 = counters.get("port0", {}), counters.get("port1", {})
    if only:
        return guest_data_result(a, b, disk_check)

    def both(key, want="True"):
        return a.get(key) == want and b.get(key) == want
    ok &= h.result("ntb-linux-clients",
                  both("driver", "ntb_hw_epf") and both("iommu_domain", "DMA") and
                  both("spad_ok") and both("doorbell_ok") and both("window_readback_ok") and
                  both("window_inbound_ok") and
                  min(int(a.get("pingpong_count", 0)), int(b.get("pingpong_count", 0))) >= 10
                  and a.get("perf_ok") == "True",
                  driver=a.get("driver"), iommu=a.get("iommu_domain"),
                  link_up_s=a.get("link_up_s"),
                  spads=f"{a.get('spad_ok')},{b.get('spad_ok')}",
                  doorbells=f"{a.get('doorbell_ok')},{b.get('doorbell_ok')}",
                  windows=f"{a.get('window_inbound_ok')},{b.get('window_inbound_ok')}",
                  pingpong=f"{a.get('pingpong_count')},{b.get('pingpong_count')}",
                  perf=a.get("perf", "-"),
                  window_writes=p0.get("window_writes", 0) + p1.get("window_writes", 0),
                  window_faults=p0.get("window_faults", 0) + p1.get("window_faults", 0),
                  window_p2p_failures=p0.get("p2p_failures", 0) + p1.get("p2p_failures", 0),
                  error=a.get("error") or b.get("error") or "-")
    down_s = b.get("kmod_link_down_s", "none")
    ok &= fabric_result(a, b)
    ok &= lend_result(a, b, p0, p1)
    ok &= guard_results(a, b, p0, p1)
    ok &= fence_result(a, b)
    ok &= restart_result(a, b)
    ok &= impersonation_result(a, b)
    ok &= lost_result(b)
    if GUEST_DATA:
        ok &= guest_data_result(a, b, disk_check)
    return ok & h.result(
        "ntb-kmod",
        both("kmod_readback_ok") and both("kmod_inbound_ok") and both("kmod_doorbell_ok") and
        a.get("kmod_trigger_taken") == "True" and b.get("kmod_trigger_rang") == "True" and
        a.get("kmod_trigger_left_after_removal") == "True" and
        b.get("kmod_trigger_rang_after_removal") == "False" and
        both("kmod_window_fd_ok") and int(a.get("kmod_export_bytes", 0)) >= 1 << 20 and
        both("kmod_unloaded") and b.get("kmod_bad_args_wrong") == "none" and
        int(b.get("kmod_bad_args", 0)) >= 20 and down_s != "none" and float(down_s) < 1.0
        and b.get("kmod_link_down") == "True" and b.get("kmod_window_all_ones") == "True"
        and b.get("kmod_unloaded_after_loss") == "True" and b.get("done") == "True",
        info=a.get("kmod_info"), export_dma=a.get("kmod_export_dma"),
        export_bytes=a.get("kmod_export_bytes"),
        windows=f"{a.get('kmod_inbound_ok')},{b.get('kmod_inbound_ok')}",
        window_fds=f"{a.get('kmod_window_fd_ok')},{b.get('kmod_window_fd_ok')}",
        doorbells=f"{a.get('kmod_doorbell_ok')},{b.get('kmod_doorbell_ok')}",
        trigger=f"{a.get('kmod_trigger_taken')},{b.get('kmod_trigger_rang')}",
        trigger_removed=f"{a.get('kmod_trigger_left_after_removal')},"
                        f"{b.get('kmod_trigger_rang_after_removal')}",
        bad_args=b.get("kmod_bad_args"), bad_args_wrong=b.get("kmod_bad_args_wrong"),
        unloaded=f"{a.get('kmod_unloaded')},{b.get('kmod_unloaded')}",
        link_down_s=down_s, window_all_ones=b.get("kmod_window_all_ones"),
        error=a.get("error") or b.get("error") or "-")

def lend_result(a, b, p0, p1):
    p2p = sum(p.get(k, 0) for p in (p0, p1) for k in ("p2p_reads", "p2p_writes"))
    return h.result(
        "ntb-lend",
        b.get("lend_config_id") == "0x00101b36" and b.get("lend_cap") is not None and
        b.get("lend_cap") == a.get("lend_cap_sysfs") and b.get("lend_identify_status") == "0"
        and b.get("lend_serial") == "VN-VFIO-01" and b.get("lend_msix_word") == "0xc0ffee" and
        b.get("lend_forwarded") == "0" and a.get("lend_lender_region_rw") == "0" and p2p > 0
        and b.get("lend_relayed") == "0",
        config_id=b.get("lend_config_id"), cap=b.get("lend_cap"),
        cap_sysfs=a.get("lend_cap_sysfs"), identify=b.get("lend_identify_status"),
        serial=b.get("lend_serial"), identify_s=b.get("lend_identify_s"),
        msix_word=b.get("lend_msix_word"), relayed_irqs=b.get("lend_relayed"),
        dma_maps=b.get("lend_dma_maps"), bar_forwarded=b.get("lend_forwarded"),
        lender_region_rw=a.get("lend_lender_region_rw"), window_p2p=p2p,
        error=f"{a.get('lend_error', '-')}|{b.get('lend_error', '-')}")


def guard_results(a, b, p0, p1):
    """The BAR guard (ntb_lend.guard_under_load): nothing the hammering thread did reached a
    BAR that did not decode (no failed peer-to-peer access in the simulated NTB, which is
    what an unsupported request on a real host is), it read all ones meanwhile, and the
    device worked after memory decode came back and after an FLR."""
    # The simulated NTB's failed peer-to-peer accesses while the guard phase ran (the Linux
    # clients' phase before it has some of its own).
    p2p = b.get("guard_p2p_failures", "none")
    p2p_failures = int(p2p) if p2p.isdigit() else -1
    withholds = int(a.get("guard_withholds", 0) or 0)
    ok = h.result(
        "mem-disable-under-load",
        b.get("guard_before_ok") == "True" and b.get("guard_during_ones") == "True" and
        int(b.get("guard_during", 0)) >= 10 and b.get("guard_after_ok") == "True" and
        withholds >= 1 and p2p_failures == 0,
        reads_before=b.get("guard_before"), reads_off=b.get("guard_during"),
        reads_after=b.get("guard_after"), all_ones=b.get("guard_during_ones"),
        ones_before_after=f"{b.get('guard_before_ones')},{b.get('guard_after_ones')}",
        p2p_unanswered=b.get("guard_p2p_unanswered"),
        lender_withholds=withholds, p2p_failures=p2p, window_faults=b.get("guard_window_faults"),
        error=f"{a.get('lend_error', '-')}|{b.get('lend_error', '-')}")
    return ok & h.result(
        "flr-under-load",
        b.get("guard_flr") == "True" and b.get("guard_flr_cap") == "True" and
        b.get("guard_final_ok") == "True" and withholds >= 2 and p2p_failures == 0,
        pcie_cap=b.get("guard_flr"), cap_after=b.get("guard_flr_cap"),
        final=b.get("guard_final_ok"), lender_withholds=withholds, p2p_failures=p2p,
        error=f"{a.get('lend_error', '-')}|{b.get('lend_error', '-')}")


def fence_result(a, b):
    """The daemon's fence without its worker (ntb_lend.fence_without_worker and
    fence_old_holder, fence_new_holder)."""
    killed_s = a.get("fence_worker_killed_s", "none")
    return h.result(
        "fence-lender-worker-killed-ntb",
        a.get("fence_worker_forced") == "True" and a.get("fence_worker_stopped_at_end") == "True"
        and a.get("fence_worker_gone") == "True" and a.get("fence_worker_logged") == "True" and
        a.get("fence_worker_respawned") == "True" and b.get("fence_before_ok") == "True" and
        b.get("fence_ones") == "before-kill" and b.get("fence_after_ok") == "True" and
        b.get("fence_new_identify") == "0" and b.get("fence_new_serial") == "VN-VFIO-01" and
        b.get("fence_old_identify") == "0" and b.get("fence_old_cc") == "0x460001" and
        b.get("fence_new_cc") == "0x0",
        worker_stopped=a.get("fence_worker_stopped_at_end"), lease_end_s=a.get("fence_lease_end_s"),
        worker_killed_after_s=killed_s, logged=a.get("fence_worker_logged"),
        respawned=a.get("fence_worker_respawned"), old_holder_ones=b.get("fence_ones"),
        old_holder_after=b.get("fence_after_kill"), new_identify=b.get("fence_new_identify"),
        new_serial=b.get("fence_new_serial"), old_identify=b.get("fence_old_identify"),
        old_cc=b.get("fence_old_cc"),
        new_cc=b.get("fence_new_cc"),
        error=f"{a.get('lend_error', '-')}|{b.get('lend_error', '-')}")


def restart_result(a, b):
    ok_word = "0xc0ffee/0"
    return h.result(
        "ntb-daemon-restart",
        b.get("restart_before") == ok_word and a.get("restart_a_took_over") == "True" and
        b.get("restart_b_heard") == "True" and b.get("restart_after_a") == ok_word and
        b.get("restart_b_took_over") == "True" and b.get("restart_after_b") == ok_word and
        b.get("restart_after_claims") == ok_word and a.get("restart_a_withdrew") == "0" and
        b.get("restart_b_withdrew") == "0" and a.get("restart_a_new_sessions") == "0" and
        b.get("restart_b_new_sessions") == "0" and b.get("restart_forwarded") == "0" and
        b.get("restart_relayed") == "0" and b.get("restart_slow_lost") == "True" and
        b.get("restart_slow_said") == "True" and b.get("restart_slow_bar") == "0xffffffff" and
        a.get("restart_a_slow_took_over") == "False" and a.get("restart_a_slow_freed") == "True",
        before=b.get("restart_before"), after_lender=b.get("restart_after_a"),
        after_borrower=b.get("restart_after_b"), after_claims=b.get("restart_after_claims"),
        heard=b.get("restart_b_heard"),
        withdrew=f"{a.get('restart_a_withdrew')},{b.get('restart_b_withdrew')}",
        new_sessions=f"{a.get('restart_a_new_sessions')},{b.get('restart_b_new_sessions')}",
        forwarded=b.get("restart_forwarded"), relayed=b.get("restart_relayed"),
        slow_lost_s=b.get("restart_slow_lost_s"), slow_said=b.get("restart_slow_said"),
        slow_bar=b.get("restart_slow_bar"), slow_took_over=a.get("restart_a_slow_took_over"),
        slow_freed=a.get("restart_a_slow_freed"),
        error=f"{a.get('restart_error', '-')}|{b.get('restart_error', '-')}")


def impersonation_result(a, b):
    """A host that names itself after one that is down (ntb_impersonate.py)."""
    return h.result(
        "ntb-impersonation-refused",
        b.get("imp_borrowed") == "True" and b.get("imp_unnamed_rc") == "2" and
        b.get("imp_unnamed_said") == "True" and a.get("imp_refused_logged") == "True" and
        a.get("imp_holder_during") == "hostb" and a.get("imp_hostb_up_during") == "False" and
        b.get("imp_impostor_up") == "False" and b.get("imp_back_up") == "True" and
        b.get("imp_back_holds") == "True" and b.get("imp_returned") == "True" and
        a.get("imp_free_after") == "True",
        borrowed=b.get("imp_borrowed"), unnamed_port_rc=b.get("imp_unnamed_rc"),
        refused_logged=a.get("imp_refused_logged"), holder_during=a.get("imp_holder_during"),
        hostb_up_during=a.get("imp_hostb_up_during"), impostor_up=b.get("imp_impostor_up"),
        real_back_up=b.get("imp_back_up"), real_holds=b.get("imp_back_holds"),
        returned=b.get("imp_returned"), free_after=a.get("imp_free_after"),
        error=f"{a.get('imp_error', '-')}|{b.get('imp_error', '-')}")


def verify_guest_regions(b, disk):
    """h.verify_backing of the regions host b's guest said it wrote (its guest_regions)."""
    regions = []
    for r in b.get("guest_regions", "-").split(";"):
        off, n, md5 = (r.split(",") + ["", "", ""])[:3]
        if off.isdigit() and n.isdigit():
            regions.append((int(off), int(n), md5))
    try:
        return h.verify_backing(disk, regions) if regions else []
    except OSError as e:
        print(f"ntb-guest-data: {disk}: {e}", file=sys.stderr)
        return []


def guest_data_result(a, b, ver):
    """ntb-guest-data (ntb_guest.py): the guest's driver found the device, its data check
    passed, what it wrote is on host a's disk (@ver: verify_guest_regions), and none of its
    I/O went through software of ours: no BAR access forwarded or served, no fabric request
    either way, no interrupt relayed (each is a doorbell route, rung in host a's kernel) and
    no doorbell message."""

    def n(side, key):
        v = side.get(key, "none")
        return int(v) if v.lstrip("-").isdigit() else None
    # What software of ours did over the data phase: host b's, host a's.
    zero = {"bar_forwarded": (n(b, "guest_borrower_forwarded"), n(a, "guest_lender_forwarded")),
            "fabric_requests": (n(b, "guest_borrower_requests"), n(a, "guest_lender_requests")),
            "irqs_relayed": (n(b, "guest_borrower_relayed"), n(a, "guest_lender_relayed")),
            "doorbell_messages": (n(a, "guest_lender_doorbells"),)}
    # Its own name, not patched-NAME: only the run on the patched QEMU has it.
    prefix, h.RESULT_PREFIX = h.RESULT_PREFIX, ""
    try:
        return h.result(
            "ntb-guest-data",
            b.get("guest_probe") == "PASS" and b.get("guest_serial") == "VN-VFIO-01" and
            b.get("guest_data") == "PASS" and len(ver) > 0 and all(v["ok"] for v in ver) and
            all(v == 0 for vs in zero.values() for v in vs),
            probe=b.get("guest_probe"), serial=b.get("guest_serial"),
            data=b.get("guest_data"), regions_on_disk=f"{sum(v['ok'] for v in ver)}/{len(ver)}",
            guest_up_s=b.get("guest_up_s"), data_s=b.get("guest_data_s"),
            **{k: ",".join(map(str, vs)) for k, vs in zero.items()},
            config_accesses=f"{b.get('guest_borrower_config')},{a.get('guest_lender_config')}",
            vfio_user_messages=b.get("guest_borrower_messages"),
            error=f"{a.get('guest_error', '-')}|{b.get('guest_error', '-')}")
    finally:
        h.RESULT_PREFIX = prefix


def lost_result(b):
    def secs(key):
        v = b.get(key, "none")
        return float(v) if v not in ("none", None) else None
    reported, ones = secs("lost_reported_s"), secs("lost_all_ones_s")
    # The borrower calls the lender lost once the link went down: the data path went with the
    # NTB session (no lease timeout to wait for it).
    return h.result(
        "ntb-peer-lost",
        b.get("lost_identify_before") == "0" and ones is not None and ones < 5 and
        reported is not None and reported <= 10 and b.get("lost_stat") == "True" and
        b.get("lost_consumer_alive") == "True" and b.get("lost_returned") == "True" and
        b.get("done") == "True",
        identify_before=b.get("lost_identify_before"), all_ones_s=ones,
        link_down_s=b.get("kmod_link_down_s"), lost_reported_s=reported,
        lender_lost_stat=b.get("lost_stat"), consumer_alive=b.get("lost_consumer_alive"),
        returned=b.get("lost_returned"), host_b_done=b.get("done"),
        error=b.get("lost_error", "-"))


def fabric_result(a, b):
    ntb, shm = a.get("ntb_p50_us"), a.get("shm_p50_us")
    good = a.get("fabric_rtt_ok") == "True" and ntb is not None and shm is not None and \
        a.get("ntb_window_ok") == "True" and a.get("shm_window_ok") == "True" and \
        a.get("daemon_link_ok") == "True" and b.get("daemon_link_ok") == "True"
    if good and not PATCHED:
        line = {"bench": "ntb-message-rtt", "ntb_p50_us": float(ntb), "shm_p50_us": float(shm),
                "ratio": round(float(ntb) / float(shm), 1),
                "ntb_rounds_us": a.get("ntb_rounds_us"), "shm_rounds_us": a.get("shm_rounds_us"),
                "where": "two TCG VMs joined by vfio-ntb-ntbsim (every window access trapped)"}
        art = h.REPO / "build" / "artifacts"
        art.mkdir(parents=True, exist_ok=True)
        (art / "ntb-message-rtt.json").write_text(json.dumps(line) + "\n")
    return h.result("ntb-fabric", good, ntb_p50_us=ntb, shm_p50_us=shm,
                    ntb_rounds_us=a.get("ntb_rounds_us"), shm_rounds_us=a.get("shm_rounds_us"),
                    window=f"{a.get('ntb_window_ok')},{a.get('shm_window_ok')}",
                    daemon_link_s=f"{a.get('daemon_link_s')},{b.get('daemon_link_s')}",
                    error=f"{a.get('error', '-')}|{b.get('error', '-')}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

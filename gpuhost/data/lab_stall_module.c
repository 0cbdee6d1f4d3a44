// SPDX-License-Identifier: GPL-2.0
/*
 * gpuhost's lab only: a kernel that stalls without a panic. Loading this module parks
 * the CPU that loads it in a busy loop with preemption disabled, for good: a soft lockup, the
 * kernel stall Debian's kernel offers no other way to cause (it has neither CONFIG_TEST_LOCKUP nor
 * LKDTM). A lab trial entry loads it with modules-load=gpuhost_stall; the trial entry's own
 * softlockup_panic=1 is what must turn the stall into a panic, and panic=N into a reboot.
 *
 * The lab's image build compiles it in the image, against the headers of the image's own kernel
 * (gpuhost/lab/builder.py), and leaves only the module: nothing loads it without that option.
 *
 * With gpuhost_stall.irqs_off=1 the CPU also spins with interrupts disabled: on a one-CPU host no
 * timer, RCU or soft-lockup report runs again, and under TCG there is no NMI watchdog either, so
 * the kernel can never panic: only a watchdog outside the CPU (the BMC's) resets the host.
 */
#include <linux/irqflags.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/preempt.h>
#include <linux/printk.h>
#include <linux/smp.h>

static bool irqs_off;
module_param(irqs_off, bool, 0444);
MODULE_PARM_DESC(irqs_off, "also disable interrupts: a stall no part of the kernel can report");

static int __init gpuhost_stall_init(void)
{
	pr_emerg("gpuhost_stall: CPU %d now spins with preemption disabled%s\n", raw_smp_processor_id(),
		 irqs_off ? " and interrupts off" : "");
	preempt_disable();
	if (irqs_off)
		local_irq_disable();
	for (;;)
		cpu_relax();
	return 0;
}
module_init(gpuhost_stall_init);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gpuhost lab: stall one CPU in the kernel (the trial boot's kernel stall fault)");

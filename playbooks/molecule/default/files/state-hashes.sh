# Everything gpuhost's playbooks may write on a host, and the boot_id: identical output before and
# after a run proves it changed no file and did not reboot (check mode; a refused host).
# tests/lab/test_faults_lab.py reads this file too.
for f in /etc/default/grub /etc/default/grub.d/* /etc/default/gpuhost-trial.cfg /etc/grub.d/* \
         /boot/grub/grub.cfg /boot/grub/grubenv /boot/initrd.img-* \
         /etc/initramfs-tools/modules /etc/initramfs-tools/scripts/init-top/* /etc/modprobe.d/* \
         /lib/modprobe.d/* /usr/lib/modprobe.d/* /etc/apt/preferences.d/* /var/lib/dpkg/status /etc/fstab \
         /etc/X11/xorg.conf /usr/bin/nvidia-uninstall; do
  [ -f "$f" ] && sha256sum "$f"
done
[ -d /var/lib/gpuhost ] && find /var/lib/gpuhost -type f | sort
cat /proc/sys/kernel/random/boot_id

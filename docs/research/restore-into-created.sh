#!/bin/bash
# Experiments E1/E2 of restore-into-created.md, standalone runsc (as root; no
# forkbox): a busybox container is checkpointed once, then each round
# restores that image into a new container (E1: runsc restore --bundle) and
# into one made by `runsc create` just before (E2), and checks both answer
# an exec. Prints one line per round; leaves nothing behind.
#
#	docs/research/restore-into-created.sh [ROUNDS]   (default 7)
set -u
W=/tmp/pcx; N=${1:-7}
R="runsc --root $W/root --platform systrap --overlay2 none --network sandbox"
cleanup(){ for c in $($R list -q 2>/dev/null); do $R delete -force $c >/dev/null 2>&1; done; for n in $(ip netns list | awk '/^pcx/{print $1}'); do ip netns del $n; done; umount $W/root/null-netns 2>/dev/null; }
cleanup; rm -rf $W; mkdir -p $W/src/rootfs
cp /bin/busybox $W/src/rootfs/
(cd $W/src && runsc spec -- /busybox sleep 1d)
mkns(){ ip netns add $1; ip -n $1 link set lo up; }
mkns pcxsrc
python3 - "$W" <<'PY'
import json,sys
W=sys.argv[1]; p=W+'/src/config.json'; c=json.load(open(p)); c['process']['terminal']=False
for n in c['linux']['namespaces']:
    if n['type']=='network': n['path']='/run/netns/pcxsrc'
json.dump(c,open(p,'w'))
PY
$R run --detach --bundle $W/src src </dev/null >$W/src.out 2>&1 || { echo run failed; cat $W/src.out; exit 1; }
$R checkpoint --image-path $W/img src || exit 1
$R delete -force src 2>/dev/null
mk(){ mkdir -p $W/$1; cp -a $W/src/rootfs $W/$1/; mkns $1
python3 - "$W" "$1" <<'PY'
import json,sys
W,n=sys.argv[1:]; c=json.load(open(W+'/src/config.json')); c['root']['path']=W+'/'+n+'/rootfs'
for x in c['linux']['namespaces']:
    if x['type']=='network': x['path']='/run/netns/'+n
json.dump(c,open(W+'/'+n+'/config.json','w'))
PY
}
ms(){ echo $(( ($2-$1)/1000000 )); }
for i in $(seq 1 $N); do
  a=pcxa$i; b=pcxb$i; mk $a; mk $b
  s=$(date +%s%N); $R restore --detach --background --image-path $W/img --bundle $W/$a $a </dev/null >$W/$a.out 2>&1 || cat $W/$a.out; e=$(date +%s%N)
  e1=$(ms $s $e)
  s=$(date +%s%N); $R create --bundle $W/$b $b </dev/null >$W/$b.out 2>&1 || cat $W/$b.out; e=$(date +%s%N)
  cr=$(ms $s $e)
  s=$(date +%s%N); $R restore --detach --background --image-path $W/img --bundle $W/$b $b </dev/null >>$W/$b.out 2>&1 || cat $W/$b.out; e=$(date +%s%N)
  e2=$(ms $s $e)
  ok1=$($R exec $a /busybox true && echo ok); ok2=$($R exec $b /busybox true && echo ok)
  echo "round $i: E1 restore ${e1} ms ($ok1) | E2 create ${cr} ms, restore-into-created ${e2} ms ($ok2)"
  $R delete -force $a >/dev/null 2>&1; $R delete -force $b >/dev/null 2>&1; ip netns del $a; ip netns del $b
done
cleanup; rm -rf $W

. /work/main/.venv/bin/activate
for i in 1 2 3; do for side in after before; do
  cd /tmp/$side && BSPEC_PROFILES=/tmp/exp/ab05/prof-$side PYTHONPATH=/tmp/$side python bench/proxy_bench.py --base-url http://127.0.0.1:8124/v1 --workload code-edit --repeats 1 --load-requests 0 --with-prediction --fresh-proxy --out /tmp/exp/ab05/$side-$i > /tmp/exp/ab05/$side-$i.log 2>&1
done; done
echo done > /tmp/exp/ab05/DONE

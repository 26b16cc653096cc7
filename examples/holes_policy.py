"""Measure how a round with holes keeps old bytes: read-modify-write vs writing covered runs.

    mpiexec -n 4 python examples/holes_policy.py
"""
import os, time, numpy as np, collio
from collio import layouts
from mpi4py import MPI
c=MPI.COMM_WORLD; r=c.rank; p=c.size
import tempfile
path=os.path.join(c.bcast(tempfile.mkdtemp() if r==0 else None), 'h.bin'); size=128<<20
if r==0:
    with open(path,'wb') as f: f.write(np.ones(size,np.uint8).tobytes())
c.Barrier()
def pattern(run, gap):
    period=run+gap; n=size//period
    idx=np.arange(r, n, p)
    return layouts.Segments(idx*period, np.full(len(idx), run))
pats={'few large holes (3M run/1M gap)':pattern(3<<20,1<<20), 'many small holes (4K run/4K gap)':pattern(4096,4096)}
for name,lay in pats.items():
    data=np.full(lay.nbytes, 7, np.uint8)
    res={k:[] for k in ('rmw','runs')}
    for it in range(7):
        for pol in res:
            if pol=='runs' and 'small' in name and it>2: continue
            c.Barrier(); t=time.perf_counter()
            with collio.open(path,'r+',holes=pol,hints={'romio_cb_write':'enable'}) as f:
                f.write_all(data,lay); f.sync()
            c.Barrier(); res[pol].append(time.perf_counter()-t)
    if r==0:
        print(name, ' '.join('%s %.0f MiB/s'%(k, lay.nbytes*p/2**20/np.median(v)) for k,v in res.items()))

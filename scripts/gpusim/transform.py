#!/usr/bin/env python3
"""gpusim: rewrites a .cu file for a host C++ compiler (see run.sh).

Every launch `kernel<<<grid, block, smem, stream>>>(args);` becomes
`sim_launch_k(dim3(grid), dim3(block), smem, stream, kernel, args);` (cuda_runtime.h here: the
arguments are copied at the launch and the kernel runs when the stream reaches it)
and the dynamic shared memory declaration `extern __shared__ __align__(16) float smem[];` becomes a
pointer to the launch's buffer. Anything else is left as written: the kernels that run are the
project's own source.
"""
import re
import sys


def transform(src):
    src = src.replace('extern __shared__ __align__(16) float smem[];', 'float *smem = (float *)sim_dyn_smem;')
    out, i = [], 0
    while True:
        j = src.find('<<<', i)
        if j < 0:
            out.append(src[i:])
            return ''.join(out)
        k = j
        while k > 0 and (src[k - 1].isalnum() or src[k - 1] in '_<>:'):
            k -= 1
        kern = src[k:j]
        e = src.index('>>>', j)
        cfg = [x.strip() for x in re.split(r',(?![^(]*\))', src[j + 3:e])]
        if len(cfg) != 4 or src[e + 3] != '(':
            sys.exit('transform.py: launch of %s needs <<<grid, block, smem, stream>>>(...)' % kern)
        depth, p = 0, e + 3
        while True:
            if src[p] == '(':
                depth += 1
            elif src[p] == ')':
                depth -= 1
                if depth == 0:
                    break
            p += 1
        args = src[e + 4:p]
        out.append(src[i:k])
        out.append('sim_launch_k(dim3(%s), dim3(%s), %s, %s, %s%s)' %
                   (cfg[0], cfg[1], cfg[2], cfg[3], kern, (', ' + args) if args.strip() else ''))
        i = p + 1


if __name__ == '__main__':
    with open(sys.argv[1]) as f:
        text = transform(f.read())
    with open(sys.argv[2], 'w') as f:
        f.write(text)

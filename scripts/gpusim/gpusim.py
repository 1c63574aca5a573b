#!/usr/bin/env python3
"""gpusim: compiles the project's .cu kernels and sim_rt.cpp for the host, relinks the given tests
of a configured and built CUDA build tree against them instead of the CUDA runtime and cuBLAS, and
runs them (see run.sh for what the simulation models and what it does not).

    gpusim.py SOURCE_DIR BUILD_DIR TEST...
"""
import glob
import os
import shlex
import subprocess
import sys

FLAGS = ['-std=c++20', '-g', '-O1', '-fsanitize=address,undefined', '-fno-omit-frame-pointer', '-fopenmp',
         '-DFLX_HAVE_CUDA=1']
CUDA_LIBS = ('libcublas.so', 'libcublasLt.so', 'libculibos.a', 'libcudart_static.a', 'libcudart.so')


def test_args(src):
    """The arguments a test takes in its ctest entry (tests/*/CMakeLists.txt)."""
    return {'test_attn_layer': [os.path.join(src, 'fluxion', 'weights', 'predictor-synthetic-llama8b.safetensors')]}


def run(cmd, **kw):
    print('+ ' + ' '.join(cmd[:6]) + (' ...' if len(cmd) > 6 else ''), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main():
    src, build, tests = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3:]
    args = test_args(os.path.abspath(src))
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(build, 'gpusim')
    os.makedirs(out, exist_ok=True)
    incs = ['-I' + here, '-I/usr/local/cuda/include']
    incs += ['-I' + d for d in sorted(glob.glob(os.path.join(src, '*', 'include')))]
    sim_objs = []
    for cu in sorted(glob.glob(os.path.join(src, '*', 'src', '*.cu'))):
        base = os.path.splitext(os.path.basename(cu))[0]
        cpp, obj = os.path.join(out, base + '.cpp'), os.path.join(out, base + '.o')
        run([sys.executable, os.path.join(here, 'transform.py'), cu, cpp])
        run(['g++'] + FLAGS + incs + ['-I' + os.path.dirname(cu), '-c', cpp, '-o', obj])
        sim_objs.append(obj)
    rt = os.path.join(out, 'sim_rt.o')
    run(['g++'] + FLAGS + ['-I/usr/local/cuda/include', '-c', os.path.join(here, 'sim_rt.cpp'), '-o', rt])
    sim_objs.append(rt)

    failed = []
    for t in tests:
        links = glob.glob(os.path.join(build, '**', 'CMakeFiles', t + '.dir', 'link.txt'), recursive=True)
        if len(links) != 1:
            sys.exit('gpusim: no single link.txt for %s under %s' % (t, build))
        wd = os.path.dirname(os.path.dirname(os.path.dirname(links[0])))
        words = []
        for w in shlex.split(open(links[0]).read()):
            if w.startswith('@'):
                words += shlex.split(open(os.path.join(wd, w[1:])).read())
            else:
                words.append(w)
        cmd = ['g++']
        skip = False
        for w in words[1:]:
            if skip:
                skip = False
                continue
            if w == '-o':
                cmd += ['-o', os.path.join(out, t)]
                skip = True
                continue
            if w in ('-lcudadevrt', '-lcudart_static') or w.endswith(CUDA_LIBS) or (w.startswith('-L') and 'cuda' in w):
                continue
            if w.endswith('.a') and not w.startswith('-'):
                path = os.path.normpath(os.path.join(wd, w))
                members = subprocess.run(['ar', 't', path], check=True, capture_output=True, text=True).stdout.split()
                cu = [m for m in members if m.endswith('.cu.o')]
                if cu:   # the archive without its device objects: the sim objects replace them
                    copy = os.path.join(out, os.path.basename(path))
                    run(['cp', path, copy])
                    run(['ar', 'd', copy] + cu)
                    w = copy
            cmd.append(w)
        cmd[1:1] = sim_objs
        cmd += ['-fopenmp', '-lpthread', '-rdynamic']   # the stand-in's cuBLAS symbols, for the dlopen(NULL) lookup
        run(cmd, cwd=wd)
        env = dict(os.environ, ASAN_OPTIONS='detect_leaks=0', FLX_LOG=os.environ.get('FLX_LOG', 'error'))
        print('== %s (simulated device)' % t, flush=True)
        r = subprocess.run(['nice', '-n', '19', os.path.join(out, t)] + args.get(t, []), cwd=wd, env=env)
        print('== %s: exit %d' % (t, r.returncode), flush=True)
        if r.returncode != 0:
            failed.append(t)
    if failed:
        sys.exit('gpusim: failed: ' + ' '.join(failed))
    print('gpusim: all passed: ' + ' '.join(tests))


if __name__ == '__main__':
    main()

"""`--codec cm`: a context-mixing compressor whose decoder is plain Python, shipped inside the
wrapped file (compressed with lzma in the same literal), for counted code where every byte
counts more than start-up time.

Each bit is predicted from the bytes before it: orders 1, 2, 3, 4 and 6 and the current word
(identifier characters), each hashed into 2^24 counters read twice (a probability adapting
at 1/(n+1.5), and the counter's recent bit history through a table learnt per order), a
match model (the byte after the last occurrence of the previous 6), a logistic mixer with
one weight set per partial byte, one SSE stage on the previous byte, and a 32-bit binary
arithmetic coder. All integer arithmetic and float +, *, / (IEEE, the same everywhere): no
libm, so every machine decodes what this one encoded.

On the Parameter Golf records' programs (minified, with every option): 7-9% fewer bytes
than brotli-11; decoding takes 10-30 s of CPython and ~200 MB (docs/BENCHMARKS.md). The
encoder and the decoder are one template (`_MODEL`), so their models cannot differ.
"""

from __future__ import annotations

from functools import cache

# The model, as the source of one function `D(b,n)`: `n` bytes from the coded bytes `b`
# (decoding), or the coded bytes of `b` (encoding, `n` unused). {BIT} reads or writes one
# bit `y` of probability `p` (12 bits) in the coder's interval [x,z]; {END} finishes.
_MODEL = """def D(b,n):
 M=16777215;Y=4294967295;T=[32768]*(M+1);C=bytearray(M+1);S=bytearray(M+1);R=[65536//(i+2)for i in range(32)]
 Q=[(c*2654435761>>7)&M for c in range(256)];F=[32768]*64;G=bytearray(64);P=[[32768]*64 for _ in range(6)]
 Z=[];U=[2047]*4096;j=0
 for d in range(4095):
  e=1+(d-2047)/4194304
  for _ in range(14):e*=e
  Z+=max(1,min(4095,int(4096-4096/(1+e)))),
  while j<=Z[d]:U[j]=d-2047;j+=1
 V=[]
 for K in range(64):s0=K>>3;s1=K&7;V+=min(s0+1,7)*8+(s1 if s1<3 else(s1>>1)+1),(s0 if s0<3 else(s0>>1)+1)*8+min(s1+1,7)
 A=[Z[min(4094,max(0,i*128-1))]*16 for i in range(33)]*65536;W=[[16384]*14 for _ in range(256)]
 o=bytearray();x=0;z=Y;a=h=l=q=0;k={}
{START}
 while {MORE}:
  H=[((v+u*2654435761)*2654435761&Y)>>8 for u,v in enumerate((a&255,a&65535,a&16777215,a&Y,a,h))]
  g=o[q]if l else-1;c=1
  for s in range(7,-1,-1):
   I=[v^Q[c]for v in H];t=[U[T[v]>>4]for v in I];t+=[U[P[u][S[v]]>>4]for u,v in enumerate(I)]
   if g>=0 and(g+256)>>s+1==c:f=min(l,31)*2+(g>>s&1);t.append(U[F[f]>>4])
   else:f=-1;t.append(0)
   t.append(256);w=W[c];d=max(-2047,min(2047,sum(map(int.__mul__,w,t))>>16));p=Z[d+2047]
   r=(c|(a&255)<<8)*33+(d+2048>>7);e=d+2048&127;m=x+(z-x>>12)*max(1,min(4095,p+3*(A[r]*(128-e)+A[r+1]*e>>11)>>2))
{BIT}
   while not(x^z)&4278190080:
{SHIFT}
   e=(y<<12)-p
   for u in range(14):w[u]+=t[u]*e>>11
   for u,v in enumerate(I):
    K=C[v];T[v]+=((y<<16)-T[v])*R[K]>>16;C[v]=K+(K<30);K=S[v];P[u][K]+=((y<<16)-P[u][K])>>7;S[v]=V[2*K+y]
   if f>=0:K=G[f];F[f]+=((y<<16)-F[f])*R[min(K,31)]>>16;G[f]=min(K+1,255)
   g2=(y<<16)+(y<<5)-y-y;A[r]+=(g2-A[r])>>6;A[r+1]+=(g2-A[r+1])>>6;c=c*2+y
  c&=255;o.append(c);a=(a<<8|c)&281474976710655
  h=(h*263+c)&Y if c==95 or c>127 or chr(c).isalnum()else 0
  if l and q<len(o)-1 and o[q]==c:l+=1;q+=1
  else:l=0
  if not l and a in k:q=k[a];l=1
  k[a]=len(o)
{END}"""

_ENCODE = {
    "{START}": " E=bytearray()",
    "{MORE}": "len(o)<len(b)",
    "{BIT}": "   y=b[len(o)]>>s&1\n   if y:z=m\n   else:x=m+1",
    "{SHIFT}": "    E.append(z>>24);x=x<<8&Y;z=z<<8&Y|255",
    "{END}": " E.append((x>>24)+(x&16777215>0));return bytes(E)",
}
_DECODE = {
    "{START}": " X=int.from_bytes(b[:4].ljust(4,b'\\0'),'big');i=4",
    "{MORE}": "len(o)<n",
    "{BIT}": "   y=X<=m\n   if y:z=m\n   else:x=m+1",
    "{SHIFT}": "    x=x<<8&Y;z=z<<8&Y|255;X=X<<8&Y|(b[i]if i<len(b)else 0);i+=1",
    "{END}": " return bytes(o)",
}


def _source(parts: dict[str, str]) -> str:
    text = _MODEL
    for marker, code in parts.items():
        text = text.replace(marker, code)
    return text + "\n"


DECODER = _source(_DECODE)  # what the wrapped file carries (compressed), defining D(b, n)


@cache
def _function(source: str):
    namespace: dict = {}
    exec(compile(source, "<recurnorm.codewrap.cm>", "exec"), namespace)
    return namespace["D"]


def compress(data: bytes) -> bytes:
    """The coded bytes of `data` (`decompress(coded, len(data))` gives them back)."""
    return _function(_source(_ENCODE))(data, 0)


def decompress(coded: bytes, size: int) -> bytes:
    """`size` bytes from `coded`: what the wrapped file's stub runs (DECODER)."""
    return _function(DECODER)(coded, size)

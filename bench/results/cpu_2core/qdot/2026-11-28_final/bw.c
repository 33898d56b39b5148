#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t n=(1ul<<30); char*buf=aligned_alloc(64,n); memset(buf,1,n);
  for(int th=1;th<=2;th++){
    double best=1e9;
    for(int r=0;r<7;r++){
      double t0=now(); long long tot=0;
      #pragma omp parallel num_threads(th) reduction(+:tot)
      { int id=omp_get_thread_num(); size_t ch=n/th; const char*p=buf+id*ch;
        __m512i a0=_mm512_setzero_si512(),a1=a0,a2=a0,a3=a0;
        for(size_t i=0;i<ch;i+=256){ a0=_mm512_add_epi64(a0,_mm512_load_si512(p+i)); a1=_mm512_add_epi64(a1,_mm512_load_si512(p+i+64)); a2=_mm512_add_epi64(a2,_mm512_load_si512(p+i+128)); a3=_mm512_add_epi64(a3,_mm512_load_si512(p+i+192)); }
        a0=_mm512_add_epi64(_mm512_add_epi64(a0,a1),_mm512_add_epi64(a2,a3)); tot+=_mm512_reduce_add_epi64(a0);}
      double t=now()-t0; if(t<best)best=t; if(tot==42)printf("x");
    }
    printf("threads %d: %.1f GB/s (best of 7)\n",th,n/best/1e9);
  }
}

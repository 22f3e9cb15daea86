"""A deterministic, token-based fake of an OpenAI-compatible completions server.

It exists so the whole speculative loop can be tested offline, and it is built
to be *hard* for a text-level client in the same ways a real server is:

* It has its own tokenizer (greedy longest match over UTF-8 bytes, with
  multi-character tokens, whole-character CJK tokens and byte-fallback tokens
  for rarer characters and emoji).  The client never sees it.
* Its prediction depends on the *token ids* of the context, so a context cut
  inside one of its tokens (``"wor" + "ld"`` instead of ``"world"``) puts it in
  a different state and it predicts something else.
* Logprob token strings follow vLLM: a token that is not valid UTF-8 on its
  own is shown as ``"\\ufffd"``, ``text_offset`` is the running sum of those
  strings' lengths (so it is wrong after such a token), and in echo mode the
  end-of-text token appears with its text ``<|endoftext|>`` while ``text``
  omits it.
* The model copies from its context (an "induction head") and deviates now
  and then, so prompt-lookup drafts are often, but not always, right.

Greedy paths it produces are *canonical*: appending a token never changes how
the text so far re-tokenizes.  Real models almost always behave so; a text
API cannot reproduce a non-canonical path exactly, and the client documents
that limit rather than pretending otherwise.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

import httpx

from . import forms
from .faults import Faults

EOS_TEXT = "<|endoftext|>"
LLAMA_FINGERPRINT = "b6500-fake0000"  # llama.cpp's "b<build>-<commit>"
OPAQUE_TEXT = "\ufffd"

_WORDS = (
    "the and for with that this from return def class self import None True False "
    "value values result data name names item items list dict print if else elif "
    "while in is not or of to a an be it as at by on we you they he she new old "
    "function var let const type int str float bool json key keys index count "
    "text line lines file files user users id ids error errors http server client "
    "model token tokens draft target accept reject speed fast slow "
).split()
_PIECES = [
    "ing", "ed", "er", "es", "ly", "tion", "():", "()", "(self", "self.", "):", " = ",
    " == ", " += ", "->", "\n", "\n\n", "  ", "    ", "        ", "\n    ", "\n        ",
    '"', "'", ", ", ". ", ": ", "{", "}", "[", "]", "},", "],", '": ', '",', "#", "# ",
    "，", "。", "、",
]
# Whole-token CJK characters; others fall back to UTF-8 byte tokens.
_CJK = "你好世界的是在不了有我这个人们中大来上国和说到时要就出会可也对生能而子那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太量再感建务做接必场件计管期市直德资命山金指克许统区保至队形社便空决治展马科司五基眼书非则听白却界达光放强即像难且权思王象完设式色路记南品住告类求据程北边死张该交规万取拉格望觉术领共确传师观清今切院让识候带导争运笑飞风步改收根干造言联持组每济车亲极林服快办议往元英士证近失转夫令准布始怎呢存未远叫台单影具罗字爱击流备兵连调深商算质团集百需价花党华城石级整府离况亚请技际约示复病息究线似官火断精满支视消越器容照须九增研写称企八功吗包片史委乎查轻易早曾除农找装广显吧阿李标谈吃图念六引历首医局突专费号尽另周较注语仅考落青随选列武红响虽推势参希古众构房半节土投某案黑维革划敌致陈律足态护七兴派孩验责营星够章音跟志底站严巴例防族供效续施留讲型料终答紧黄绝奇察母京段依批群项故按河米围江织害斗双境客纪采举杀攻父苏密低朝友诉止细愿千值仍男钱破网热助倒育属坐帝限船脸职速刻乐否刚威毛状率甚独球般普怕弹校苦创假久错承印晚兰试股拿脑预谁益阳若哪微尼继送急血惊伤素药适波夜省初喜卫源食险待述陆习置居劳财环排福纳欢雷警获模充负云停木游龙树疑层冷洲冲射略范竟句室异激汉村哈策演简卡罪判担州静退既衣您宗积余痛检差富灵协角占配征修皮挥胜降阶审沉坚善妈刘读啊超免压银买皇养伊怀执副乱抗犯追帮宣佛岁航优怪香著田铁控税左右份穿艺背阵草脚概恶块顿敢守酒岛托央户烈洋哥索胡款靠评版宝座释景顾弟登货互付伯慢欧换闻危忙核暗姐介坏讨丽良序升监临亮露永呼味野架域沙掉括舰鱼杂误湾吉减编楚肯测败屋跑梦散温困剑渐封救贵枪缺楼县尚毫移娘朋画班智亦耳恩短掌恐遗固席松秘谢鲁遇康虑幸均销钟诗藏赶剧票损忽巨炮旧端探湖录叶春乡附吸予礼港雨呀板庭妇归睛饭额含顺输摇招婚脱补谓督毒油疗旅泽材灭逐莫笔亡鲜词圣择寻厂睡博勒烟授诺伦岸奥唐卖俄炸载洛健堂旁宫喝借君禁阴园谋宋避抓荣姑孙逃牙束跳顶玉镇雪午练迫爷篇肉嘴馆遍凡础洞卷坦牛宁纸诸训私庄祖丝翻暴森塔默握戏隐熟骨访弱蒙歌店鬼软典欲萨伙遭盘爸扩盖弄雄稳忘亿刺拥徒姆杨齐赛趣曲刀床迎冰虎玩析窗醒妻透购替塞努休虎扬途侵刑绿兄迅套贸毕唯谷轮库迹尤竞街促延震弃甲伟麻川申缓潜闪售灯针哲络抵朱埃抱鼓植纯夏忍页杰筑折郑贝尊吴秀混臣雅振染盛怒舞圆搞狂措姓残秋培迷诚宽宇猛摆梅毁伸摩盟末乃悲拍丁赵硬麦蒋操耶阻订彩抽赞魔纷沿喊违妹浪汇币丰蓝殊献桌啦瓦莱援译夺汽烧距裁偏符勇触课敬哭懂墙袭召罚侠厅拜巧侧韩冒债曼融惯享戴童犹乘挂奖绍厚纵障讯涉彻刊丈爆乌役描洗玛患妙镜唱烦签仙彼弗症仿倾牌陷鸟轰咱菜闭奋庆撤泪茶疾缘播朗杜奶季丹狗尾仪偷奔珠虫驻孔宜艾桥淡翼恨繁寒伴叹旦愈潮粮缩罢聚径恰挑袋灰捕徐珍幕映裂泰隔启尖忠累炎暂估泛荒偿横拒瑞忆孤鼻闹羊呆厉衡胞零穷舍码赫婆魂灾洪腿胆津俗辩胸晓劲贫仁偶辑邦恢赖圈摸仰润堆碰艇稍迟辆废净凶署壁御奉旋冬矿抬蛋晨伏吹鸡倍糊秦盾杯租骑乏隆诊奴摄丧污渡旗甘耐凭扎抢绪粗肩梁幻菲皆碎宙叔岩荡综爬荷悉蒂返井壮薄悄扫敏碍殖详迪矛霍允幅撒剩凯颗骂赏液番箱贴漫酸郎腰舒眉忧浮辛恋餐吓挺励辞艘键伍峰尺昨黎辈贯侦滑券崇扰宪绕趋慈乔阅汗枝拖墨胁插箭腊粉泥氏彭拔骗凤慧媒佩愤扑龄驱惜豪掩兼跃尸肃帕驶堡届欣惠册储飘桑闲惨洁踪勃宾频仇磨递邪撞拟滚奏巡颜剂绩贡疯坡瞧截燃焦殿伪柳锁逼颇昏劝呈搜勤戒驾漂饮曹朵仔柔俩孟腐幼践籍牧凉牲佳娜浓芳稿竹腹跌逻垂遵脉貌柏狱猜怜惑陶兽帐饰贷昌叙躺钢沟寄扶铺邓寿惧询汤盗肥尝匆辉奈扣廷澳嘛董迁凝慰厌脏腾幽怨鞋丢埋泉涌辖躲晋紫艰魏吾慌祝邮吐狠鉴曰械咬邻赤挤弯椅陪割揭韦悟聪雾锋梯猫祥阔誉筹丛牵鸣沈阁穆屈旨袖猎臂蛇贺柱抛鼠瑟戈牢逊迈欺吨琴衰瓶恼燕仲诱狼池疼卢仗冠粒遥吕玄尘冯抚浅敦纠钻晶岂峡苍喷耗凌敲菌赔涂粹扁亏寂煤熊恭湿循暖糖赋抑秩帽哀宿踏烂袁侯抖夹昆肝擦猪炼恒慎搬纽纹玻渔磁铜齿跨押怖漠疲叛遣兹祭醉拳弥斜档稀捷肤疫肿豆削岗晃吞宏癌肚隶履涨耀扭坛拨沃绘伐堪仆郭牺歼墓雇廉契拼惩捉覆刷劫嫌瓜歇雕闷乳串娃缴唤赢莲霸桃妥瘦搭赴岳嘉舱俊址庞耕锐缝悔邀玲惟斥宅添挖呵讼氧浩羽斤酷掠妖祸侍乙妨贪挣汪尿莉悬唇翰仓轨枚盐览傅帅庙芬屏寺胖璃愚滴疏萧姿颤丑劣柯寸扔盯辱匹俱辨饿蜂哦腔郁溃谨糟葛苗肠忌溜鸿爵鹏鹰笼丘桂滋聊挡纲肌茨壳痕碗穴膀卓贤卧膜毅锦欠哩函茫昂薛皱夸豫胃舌剥傲拾窝睁携陵哼棉晴铃填饲渴吻扮逆脆喘罩卜炉柴愉绳胎蓄眠竭喂傻慕浑奸扇柜悦拦诞饱乾泡贼亭夕爹酬儒姻卵氛泄杆挨僧蜜吟猩遂狭肖甜霞驳裕顽於摘矮秒卿畜咽披辅勾盆疆赌塑畏吵囊嗯泊肺骤缠冈羞瞪吊贾漏斑涛悠鹿俘锡卑葬铭滩嫁催璇翅盒蛮矣潘歧赐鲍锅廊拆灌勉盲宰佐啥胀扯禧辽抹筒棋裤唉朴咐孕誓喉妄拘链驰栏逝窃艳臭纤玑棵趁匠盈翁愁瞬婴孝颈倘浙谅蔽畅赠妮莎尉冻跪闯葡後厨鸭颠遮谊圳吁仑辟瘤嫂陀框谭亨钦庸歉芝吼甫衫摊宴嘱衷娇陕矩浦讶耸裸碧摧薪淋耻胶屠鹅饥盼脖虹翠崩账萍逢赚撑翔倡绵猴枯巫昭怔渊凑溪蠢禅阐旺寓藤匪伞碑挪琼脂谎慨菩萄狮掘抄岭晕逮砍挽坟悍侨倚娶晰浴郊呕葱咖茂枕嗓庆"
_EMOJI = "😀😃😄😁😆😅😂🙂🙃😉😊😇🥰😍🤩😘😗😚😙😋😛😜🤪😝🤑🤗🤭🤫🤔🤐🤨😐😑😶😏😒🙄😬🤥😌😔😪🤤😴😷🤒🤕🤢🤮🤧🥵🥶🥴😵🤯🤠🥳😎🤓🧐😕😟🙁😮😯😲😳🥺😦😧😨😰😥😢😭😱😖😣😞😓😩😫🥱😤😡😠🤬😈👿💀💩🤡👹👺👻👽👾🤖🎉🚀🔥✨👍👎👋🙏💡📦🐍"


# Byte-level mode: pieces of real byte-level BPE vocabularies that split
# characters in every way a client can trip over.
_PREFIXED = ["th", "the", "ther", "there", "them", "then", " th", " the", " there", "in", "int", "inte", "integer", " in", " int"]
_SPACES = [" ", "  ", "   ", "\t", "\t\t", "\r", "\r\n", "\r\n\r\n", " \n", "\n\n\n", " \r\n", ":\n", ")\n", ".\r\n", "\n\t", "\n  "]
_MARKS = ["e\u0301", "\u0301", "\u0308", "a\u0308", "\u200d", "\ufe0f", "🇫", "🇷", "\u2764\ufe0f"]


def _mixed_pieces() -> list[bytes]:
    """Byte strings that cut characters: a character's tail bytes with whole
    characters after it ("\\xad文本"), whole characters with the next one's
    lead bytes ("中\\xe6"), and emoji pieces with a space."""
    pieces: list[bytes] = []
    chars = "中文本字节测试你好世界。，😀🚀👍🙂"
    for a, b, c in zip(chars, chars[1:], chars[2:]):
        ra, rb, rc = a.encode(), b.encode(), c.encode()
        pieces += [ra[1:] + rb, ra[2:] + rb + rc, ra[-1:] + rb, ra + rb[:1], ra + rb[:2], rb[1:] + rc[:1], ra[1:2]]
    for emoji in "😀🚀👍🙂🎉":
        raw = emoji.encode()
        pieces += [b" " + raw[:2], raw[2:] + b" ", raw[1:3], raw[:3], raw[3:] + b"!"]
    return pieces


def _vocabulary(byte_level: bool = False) -> list[bytes]:
    """Byte tokens 0..255 first (the fallback), then longer tokens."""
    tokens: list[bytes] = [bytes([b]) for b in range(256)]
    extra: list[str] = []
    for word in _WORDS:
        extra += [word, " " + word, word.capitalize(), " " + word.capitalize()]
    extra += _PIECES
    extra += list(_CJK[: len(_CJK) // 2])  # the other half stays byte-split
    if byte_level:
        extra += _PREFIXED + _SPACES + _MARKS
    seen = set(tokens)
    raws = [text.encode() for text in extra] + (_mixed_pieces() if byte_level else [])
    for raw in raws:
        if raw not in seen:
            seen.add(raw)
            tokens.append(raw)
    for emoji in _EMOJI:  # 4-byte emoji: two 2-byte tokens, each invalid UTF-8 alone
        raw = emoji.encode()
        for half in (raw[:2], raw[2:]) if len(raw) == 4 else (raw,):
            if half not in seen:
                seen.add(half)
                tokens.append(half)
    return tokens


class FakeTokenizer:
    """Greedy longest-match tokenizer over UTF-8 bytes, plus one EOS token.

    ``byte_level``: a vocabulary that also cuts characters as byte-level
    BPE ones do (tokens mixing a character's tail bytes with whole
    characters, whole characters with the next one's lead bytes), with
    tokens that are prefixes of others, whitespace-only tokens and tokens
    across newlines and CRLF.
    """

    def __init__(self, byte_level: bool = False) -> None:
        self.byte_level = byte_level
        self.vocab: list[bytes] = _vocabulary(byte_level)
        self.eos_id = len(self.vocab)
        self._ids = {raw: i for i, raw in enumerate(self.vocab)}
        self.max_token_bytes = max(len(raw) for raw in self.vocab)

    def encode(self, text: str) -> list[int]:
        return self.encode_bytes(text.encode())

    def encode_bytes(self, data: bytes) -> list[int]:
        ids, pos, n = [], 0, len(data)
        while pos < n:
            for length in range(min(self.max_token_bytes, n - pos), 0, -1):
                token = self._ids.get(data[pos : pos + length])
                if token is not None:
                    ids.append(token)
                    pos += length
                    break
        return ids

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == self.eos_id else self.vocab[token]

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(t) for t in ids).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """How vLLM shows one token in logprobs."""
        if token == self.eos_id:
            return EOS_TEXT
        try:
            return self.vocab[token].decode("utf-8")
        except UnicodeDecodeError:
            return OPAQUE_TEXT


def _mix(values: Iterable[int]) -> int:
    """FNV-1a over a few ids: a stable hash (Python's hash() is salted)."""
    h = 0x811C9DC5
    for v in values:
        h = ((h ^ (v & 0xFFFFFFFF)) * 0x01000193) & 0xFFFFFFFF
    return h


def _valid_utf8_prefix(data: bytes) -> bool:
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
        return True
    except UnicodeDecodeError:
        return False


def _incomplete_tail(data: bytes) -> bytes:
    """The bytes of a character that ``data`` has started but not finished."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 1 if byte < 0x80 else 2 if byte >= 0xC0 and byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data[-back:] if back < need else b""
    return b""


def _ends_mid_character(data: bytes) -> bool:
    return bool(_incomplete_tail(data))


class _State:
    """A growing context with an n-gram index for the induction head.

    ``last_end[n][gram]`` is the end index of the latest occurrence of
    ``gram`` that ends strictly before the current end, so a lookup finds an
    *earlier* occurrence of the current suffix.
    """

    NGRAM_SIZES = (8, 4, 2, 1)

    def __init__(self, model: "FakeModel") -> None:
        self.model = model
        self.ids: list[int] = []
        self.data = bytearray()
        self.last_end: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.NGRAM_SIZES}

    def append(self, token: int) -> None:
        end = len(self.ids)
        for n in self.NGRAM_SIZES:
            if end >= n:
                self.last_end[n][tuple(self.ids[end - n : end])] = end
        self.ids.append(token)
        self.data += self.model.tokenizer.token_bytes(token)

    def induction(self) -> int | None:
        end = len(self.ids)
        for n in self.NGRAM_SIZES:
            if end >= n:
                j = self.last_end[n].get(tuple(self.ids[end - n :]))
                if j is not None and j < end:
                    return self.ids[j]
        return None

    def ranked(self) -> tuple[tuple[int, float], tuple[int, float]]:
        """The top-2 next tokens with logprobs (distinct values: no ties)."""
        model, tok = self.model, self.model.tokenizer
        h = _mix(self.ids[-3:] + [len(self.ids) % 7])
        mid_char = _ends_mid_character(bytes(self.data[-4:]))
        candidates: list[int] = []
        follow = self.induction()
        if follow is not None and follow != tok.eos_id and (mid_char or h % model.deviate_every):
            candidates.append(follow)
        text_end = bytes(self.data[-1:])
        if not mid_char and len(self.ids) > 2 and text_end in (b"\n", b".") and h % model.eos_every == 0:
            candidates.insert(0, tok.eos_id)
        start = h % len(model.free_choices)
        candidates += model.free_choices[start:] + model.free_choices[:start]
        if mid_char:
            candidates += model.completions
        top: list[tuple[int, float]] = []
        # Second pass only for contexts that are not canonical themselves
        # (built by hand in tests): then no candidate can keep them canonical.
        for canonical in (True, False):
            for c in candidates:
                if len(top) == 2:
                    return top[0], top[1]
                if c in (t for t, _ in top) or (c != tok.eos_id and not self._acceptable(c, canonical)):
                    continue
                lp = -(0.01 + (h % 50) / 100.0) if not top else top[0][1] - 1.0 - (h % 7) / 10.0
                top.append((c, lp))
        raise AssertionError("the fake model found no next token")  # pragma: no cover

    def _acceptable(self, token: int, canonical: bool = True) -> bool:
        tok = self.model.tokenizer
        raw = tok.token_bytes(token)
        if not _valid_utf8_prefix(_incomplete_tail(bytes(self.data[-4:])) + raw):
            return False
        if not canonical:
            return True
        # Canonical: re-tokenizing the tail (from a token boundary far enough
        # back that no longest match can reach across it) gives the same ids.
        k, width = len(self.ids), 0
        while k > 0 and width < tok.max_token_bytes:
            k -= 1
            width += len(tok.token_bytes(self.ids[k]))
        window = self.ids[k:] + [token]
        return tok.encode_bytes(b"".join(tok.token_bytes(t) for t in window)) == window


class FakeModel:
    """A greedy 'model' over fake token ids. Deterministic, no randomness."""

    def __init__(self, tokenizer: FakeTokenizer | None = None, *, deviate_every: int = 9, eos_every: int = 31) -> None:
        self.tokenizer = tokenizer or FakeTokenizer()
        self.deviate_every = deviate_every
        self.eos_every = eos_every
        tok = self.tokenizer
        whole = [i for i, raw in enumerate(tok.vocab) if len(raw) > 1 and _valid_utf8_prefix(raw) and not _ends_mid_character(raw)]
        ascii_printable = [i for i in range(32, 127)]
        self.free_choices = whole + ascii_printable + [10]
        if tok.byte_level:  # it also starts characters it does not finish ("中\\xe6")
            starts_whole = [i for i, raw in enumerate(tok.vocab) if len(raw) > 1 and (raw[0] < 0x80 or raw[0] >= 0xC0)]
            self.free_choices += [i for i in starts_whole if _valid_utf8_prefix(tok.vocab[i]) and _ends_mid_character(tok.vocab[i])]
        self.completions = [i for i, raw in enumerate(tok.vocab) if not _valid_whole(raw)]

    def state(self, ids: Iterable[int]) -> _State:
        st = _State(self)
        for t in ids:
            st.append(t)
        return st


def _ngram_draft(context: list[int], k: int) -> list[int]:
    """Prompt lookup as vLLM's n-gram does it: the tokens after the latest
    earlier occurrence of the context's last 4 (else 3, else 2) tokens."""
    for n in (4, 3, 2):
        if len(context) <= n:
            continue
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


def _merged_steps(chunks: list[dict], runs: list[int]) -> list[dict]:
    """Per-token stream chunks joined into one per step (``runs``: tokens
    per step): their texts and logprobs lists concatenated."""
    merged, k = [], 0
    for run in runs:
        group = chunks[k : k + run]
        k += run
        if not group:
            break
        first = json.loads(json.dumps(group[0]))
        choice = first["choices"][0]
        for chunk in group[1:]:
            other = chunk["choices"][0]
            choice["text"] += other["text"]
            for key, values in (other.get("logprobs") or {}).items():
                if isinstance(values, list):
                    choice["logprobs"][key] = choice["logprobs"][key] + values
        merged.append(first)
    return merged + chunks[k:]


def _valid_whole(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# --------------------------------------------------------------------------- server


class _PacedStream(httpx.AsyncByteStream):
    """Server-sent events one chunk at a time, ``step`` seconds apart."""

    def __init__(self, chunks: list[dict], step: float) -> None:
        self.chunks, self.step = chunks, step

    async def __aiter__(self):
        for chunk in self.chunks:
            await asyncio.sleep(self.step)
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"


@dataclass
class _Answer:
    """One greedy generation, before the server renders it."""

    target: "FakeTarget"
    ids: list[int]  # generated ids, an end-of-text one included
    raws: list[bytes]  # their bytes (none for the end-of-text)
    steps: list[str]  # the text each id showed ("" while a character was unfinished)
    text: str  # the shown text, cut at a stop string
    finish: str
    held: bytes = b""  # an unfinished character that max_tokens cut

    def shown(self, stream: bool) -> str:
        """The whole answer's text, the unfinished end as the server renders it."""
        return self.text + (forms.lossy(self.held) if self.held and self.target.renders_cut(stream) else "")


@dataclass
class FakeTarget:
    """The fake server: an httpx handler (for respx / MockTransport) and a
    real HTTP server for subprocess tests.

    ``echo``: "yes" (supported), "refuse" (HTTP 400 like OpenAI), or
    "ignore" (silently returns no echo, like some servers).
    ``latency`` / ``decode_s`` / ``prefill_s`` simulate costs in the async
    handler, so policy and cancellation tests have something to measure.
    """

    model_name: str = "fake-model"
    echo: str = "yes"
    latency: float = 0.0
    decode_s: float = 0.0
    prefill_s: float = 0.0
    api_key: str | None = None
    # Prompt plus max_tokens beyond this many tokens is refused as vLLM does.
    context_window: int | None = None
    # Error messages repeat the Authorization header, as some proxies do
    # (for tests that the client never shows the key).
    leaky_errors: bool = False
    # The chat endpoint.  ``chat_prefill`` is how a final assistant message
    # is treated: "vllm" continues it when asked (``continue_final_message``
    # and ``add_generation_prompt=false``), "llama" always continues it
    # (assistant prefill, unknown fields ignored), "trailing" continues it
    # without repeating it (Groq), "tgi" too, with its trailing whitespace
    # trimmed (TGI cuts the template after the message and trims its end),
    # "prefix" continues it only where it
    # says ``"prefix": true`` and refuses it otherwise, and vLLM's fields
    # (Mistral; DeepSeek's ``/beta``), "none" closes it and starts a new
    # turn (as OpenAI does).  ``chat_trims``: the template strips each
    # message's content (as ``| trim`` in Gemma's).  ``strict_fields``:
    # unknown request fields are a 400, as OpenAI's API answers them.
    chat_prefill: str = "vllm"
    chat_trims: bool = False
    strict_fields: bool = False
    # OpenAI's Predicted Outputs: usage reports the predicted tokens the
    # answer kept and the rest (self-hosted servers ignore ``prediction``).
    predicted_outputs: bool = False
    # A server that speculates on its own, as vLLM's n-gram does: each step
    # drafts up to this many tokens from the context (its latest earlier
    # match of the last 2 to 4 tokens) and a streamed completion with
    # logprobs sends the step's accepted tokens in one chunk.  0: none.
    speculates: int = 0
    # How logprobs show tokens that split characters (``forms.FORMS``:
    # "vllm-legacy", "vllm" for vLLM 0.32, "vllm-0.10", "openai",
    # "token-id", "llama"),
    # and which stop string wins when several complete at once
    # (``_stopping.RULES``).  An unfinished character at the end shows as
    # U+FFFD in "vllm-legacy" and in llama.cpp's non-streamed answers; vLLM
    # 0.32 and llama.cpp's streams drop it.
    token_form: str = "vllm-legacy"
    stop_rule: str = "first-listed"
    # llama.cpp form: honour ``timings_per_token`` in streams (its real server does).
    timings_per_token: bool = True
    # ``/tokenize`` and ``/detokenize`` at the server's root (vLLM, llama.cpp; hosted APIs have none).
    tokenize: bool = True
    # SGLang's native ``/generate`` at the server's root, which scores the
    # prompt (``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``);
    # pair with ``echo="ignore"``: its ``/v1/completions`` echo gives no prompt logprobs.
    sglang_generate: bool = False
    # TGI's ``/generate`` at the server's root: ``details`` and
    # ``decoder_input_details`` list the prompt's tokens with their own
    # logprobs only (pair with ``echo="ignore"``, and ``chat_prefill="tgi"``).
    tgi_generate: bool = False
    # ``/v1/completions`` offered (self-hosted servers); many hosted APIs serve chat only.
    completions: bool = True
    # The chat template: "plain" ("User:\n..."), or "chatml" (Qwen's
    # ``<|im_start|>`` markers, so a replayed recording's prompt is met).
    chat_template: str = "plain"
    model: FakeModel = field(default_factory=FakeModel)
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tokenizer(self) -> FakeTokenizer:
        return self.model.tokenizer

    def renders_cut(self, stream: bool) -> bool:
        """Does an unfinished character at the end show (as U+FFFD)?"""
        return self.token_form == "vllm-legacy" or (self.token_form == "llama" and not stream)

    # -- the model as a plain greedy generator (what a plain call returns) --

    def generate(self, prompt: str, max_tokens: int = 16, stop: list[str] | None = None, *, stream: bool = False) -> tuple[str, str, list[int]]:
        """(text, finish_reason, generated ids) exactly as a plain call returns
        them (``stream``: as a plain streamed call's text adds up)."""
        answer = self._decode(self.tokenizer.encode(prompt), max_tokens, stop or [])
        return answer.shown(stream), answer.finish, answer.ids

    def _too_long(self, prompt_ids: list[int], max_tokens: int):
        """vLLM's 400 for a prompt and max_tokens beyond the context window (where one is set)."""
        if self.context_window is None or len(prompt_ids) + max_tokens <= self.context_window:
            return None
        return self._error(
            400,
            f"This model's maximum context length is {self.context_window} tokens. However, you requested "
            f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.",
            "BadRequestError",
        )

    def _decode(self, prompt_ids: list[int], max_tokens: int, stop: list[str]) -> "_Answer":
        """Greedy decoding with the server's detokenizer and stop rule.

        Text shows as vLLM's incremental detokenizer and llama.cpp show it: a
        token that leaves a character unfinished shows nothing, the one that
        completes it shows all that was held (``forms.visible_steps``).
        Stop strings are looked for in that text after each token that
        showed some, by ``stop_rule``.
        """
        st = self.model.state(prompt_ids)
        answer = _Answer(self, [], [], [], "", "length")
        held, sent = b"", [0]
        while len(answer.ids) < max_tokens:
            (token, _), _ = st.ranked()
            answer.ids.append(token)
            if token == self.tokenizer.eos_id:
                answer.finish = "stop"
                answer.steps.append("")
                break
            st.append(token)
            raw = self.tokenizer.token_bytes(token)
            answer.raws.append(raw)
            held += raw
            new, held = (forms.lossy(held), b"") if forms.is_whole(held) else ("", held)
            answer.steps.append(new)
            answer.text += new
            cut = self._stop_cut(answer.text, new, raw, stop, sent) if new and stop else None
            if cut is not None:
                answer.text, answer.finish = answer.text[:cut], "stop"
                break
        answer.held = held if answer.finish == "length" else b""
        return answer

    def _stop_cut(self, text: str, new: str, raw: bytes, stop: list[str], sent: list[int]) -> int | None:
        """Where the server cuts ``text`` after a token that showed ``new``."""
        if self.stop_rule == "earliest-start":
            # llama.cpp: in bytes, in the text not sent yet, each stop from
            # (length - stop - this token's bytes); the earliest start wins.
            # A tail that could begin a stop is not sent yet.
            data = text.encode()
            unsent = data[sent[0] :]
            starts = [unsent.find(w, max(0, len(unsent) - len(w) - len(raw))) for w in (s.encode() for s in stop)]
            starts = [p for p in starts if p != -1]
            if starts:
                return len(data[: sent[0] + min(starts)].decode())
            if not any(unsent.endswith(w[:k]) for w in (s.encode() for s in stop) for k in range(1, min(len(unsent), len(w)) + 1)):
                sent[0] = len(data)
            return None
        found = []
        for order, s in enumerate(stop):
            index = text.find(s, max(0, len(text) - len(new) - len(s) + 1))
            if index == -1:
                continue
            if self.stop_rule == "first-listed":
                return index
            found.append((index + len(s), order, index))  # vLLM 0.32: completes first, then list order
        return min(found)[2] if found else None

    # -- HTTP ---------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        status, payload, stream_chunks = self._dispatch(request.method, request.url.path, request.headers, request.content)
        if stream_chunks is not None:
            body = "".join(f"data: {json.dumps(c)}\n\n" for c in stream_chunks) + "data: [DONE]\n\n"
            return httpx.Response(status, content=body.encode(), headers={"content-type": "text/event-stream"})
        return httpx.Response(status, json=payload)

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        """As :meth:`handle`, taking the simulated time; a stream comes chunk
        by chunk (``decode_s`` apart, or at least yielding to the event loop),
        so concurrent streams interleave as a real server's do."""
        status, payload, stream_chunks = self._dispatch(request.method, request.url.path, request.headers, request.content)
        record = self.requests[-1] if self.requests else None
        if stream_chunks is None:
            delay = self._simulated_seconds(record)
            if delay:
                await asyncio.sleep(delay)
            return httpx.Response(status, json=payload)
        first = self.latency + self.prefill_s * (record or {}).get("_prefilled", 0)
        if first:
            await asyncio.sleep(first)
        return httpx.Response(status, stream=_PacedStream(stream_chunks, self.decode_s), headers={"content-type": "text/event-stream"})

    def _simulated_seconds(self, record: dict[str, Any] | None) -> float:
        if record is None:
            return self.latency
        return self.latency + self.decode_s * record.get("_generated", 0) + self.prefill_s * record.get("_prefilled", 0)

    def _error(self, status: int, message: str, kind: str) -> tuple[int, dict, None]:
        return status, {"error": {"message": message, "type": kind, "code": status}}, None

    def _dispatch(self, method: str, path: str, headers: Any, content: bytes) -> tuple[int, dict, list | None]:
        try:
            status, payload, chunks = self._answer(method, path, headers, content)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            # A field of the wrong type: real servers validate the request
            # (vLLM with pydantic) and answer 400, never 500.
            status, payload, chunks = self._error(400, f"Invalid request: {type(exc).__name__}", "BadRequestError")
        if self.leaky_errors and status >= 400:
            payload["error"]["message"] += f" (request had authorization: {headers.get('authorization')})"
        return status, payload, chunks

    def _answer(self, method: str, path: str, headers: Any, content: bytes) -> tuple[int, dict, list | None]:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return self._error(401, "Invalid API key.", "AuthenticationError")
        if method == "GET" and path.endswith("/models"):
            listed = {"id": self.model_name, "object": "model"}
            if self.context_window is not None:
                listed["max_model_len"] = self.context_window  # as vLLM lists it
            return 200, {"object": "list", "data": [listed]}, None
        if not self.tokenize and path.endswith("tokenize"):
            return self._error(404, f"Not Found: {path}", "NotFoundError")
        if method == "POST" and path.endswith("/tokenize") and not path.startswith("/v1"):
            return self._tokenize(content)  # vLLM's, at the server's root
        if method == "POST" and path.endswith("/detokenize") and not path.startswith("/v1"):
            ids = json.loads(content or b"{}").get("tokens") or []
            return 200, {"prompt": self.tokenizer.decode(int(i) for i in ids)}, None
        if method == "POST" and path.endswith("/generate") and not path.startswith("/v1") and (self.sglang_generate or self.tgi_generate):
            body = json.loads(content or b"{}")
            if self.tgi_generate:
                return self._tgi(body) if isinstance(body.get("inputs"), str) else self._error(422, "Failed to deserialize the JSON body: missing field `inputs`", "validation")
            return self._sglang(body)
        if method != "POST" or not path.endswith("/completions"):
            return self._error(404, f"Not Found: {path}", "NotFoundError")
        try:
            body = json.loads(content or b"{}")
        except ValueError:
            return self._error(400, "Invalid JSON body.", "BadRequestError")
        if not isinstance(body, dict):
            return self._error(400, "The body must be a JSON object.", "BadRequestError")
        if body.get("model") != self.model_name:
            return self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if path.endswith("/chat/completions"):
            return self._chat(body)
        if not self.completions:
            return self._error(404, f"Not Found: {path}", "NotFoundError")
        if body.get("echo") and self.echo == "refuse":
            return self._error(400, "echo is not supported for this model", "BadRequestError")
        return self._complete(body)

    def _tokenize(self, content: bytes) -> tuple[int, dict, None]:
        body = json.loads(content or b"{}")
        if "messages" in body:
            text = self.render_chat(body["messages"], add_generation_prompt=body.get("add_generation_prompt", True))
        else:
            text = body.get("prompt", body.get("content", ""))  # vLLM's field, llama.cpp's
        ids = self.tokenizer.encode(text)
        return 200, {"count": len(ids), "max_model_len": self.context_window or 32768, "tokens": ids}, None

    # -- chat -----------------------------------------------------------------

    _VLLM_FIELDS = ("continue_final_message", "add_generation_prompt", "prompt_logprobs", "echo")

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, continue_final: bool = False) -> str:
        """The fake's chat template; a continued final message is left open.
        (Plain words by default, not ``<|im_start|>``-like markers: the fake's
        induction head would copy those into its answers; ChatML only for a
        replay, whose recorded prompts are ChatML text.)"""
        if self.chat_template == "chatml":
            opening, closing, reply = "<|im_start|>{role}\n", "<|im_end|>\n", "<|im_start|>assistant\n"
        else:
            opening, closing, reply = "{Role}:\n", "\n\n", "Assistant:\n"
        parts = []
        for i, message in enumerate(messages):
            content = message.get("content") or ""
            if self.chat_trims:
                content = content.strip()
            head = opening.format(role=message["role"], Role=message["role"].title())
            if continue_final and i == len(messages) - 1:
                parts.append(head + (content.rstrip() if self.chat_prefill == "tgi" else content))
                return "".join(parts)
            parts.append(head + content + closing)
        if add_generation_prompt:
            parts.append(reply)
        return "".join(parts)

    def _chat(self, body: dict) -> tuple[int, dict, list | None]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str) for m in messages
        ):
            return self._error(400, "messages must be a non-empty list of {role, content} objects", "BadRequestError")
        if self.strict_fields:
            unknown = [k for k in self._VLLM_FIELDS if k in body]
            if unknown:
                return self._error(400, f"Unrecognized request argument supplied: {unknown[0]}", "BadRequestError")
        final_is_assistant = messages[-1]["role"] == "assistant"
        if self.chat_prefill == "vllm":
            continue_final = bool(body.get("continue_final_message"))
            add_generation_prompt = body.get("add_generation_prompt", True)
            if continue_final and add_generation_prompt:
                return self._error(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "BadRequestError")
        elif self.chat_prefill == "prefix":
            if final_is_assistant and messages[-1].get("prefix") is not True:
                return self._error(400, "Expected last role User or Tool (or Assistant with prefix True) for serving but got assistant", "invalid_request_message_order")
            if unknown := [k for k in self._VLLM_FIELDS if k in body]:
                return self._error(422, f"body.{unknown[0]}: Extra inputs are not permitted", "invalid_request_error")
            continue_final, add_generation_prompt = final_is_assistant, not final_is_assistant
        elif self.chat_prefill in ("llama", "trailing", "tgi"):
            continue_final, add_generation_prompt = final_is_assistant, not final_is_assistant
        else:
            continue_final, add_generation_prompt = False, True
        prompt = self.render_chat(messages, add_generation_prompt=add_generation_prompt, continue_final=continue_final)
        tok = self.tokenizer
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        prompt_ids = tok.encode(prompt)
        if (refused := self._too_long(prompt_ids, max_tokens)) is not None:
            return refused
        answer = self._decode(prompt_ids, max_tokens, stop)
        text, finish, out = answer.shown(bool(body.get("stream"))), answer.finish, answer.ids
        wants_prompt_logprobs = self.chat_prefill == "vllm" and body.get("prompt_logprobs") is not None
        if wants_prompt_logprobs and self.echo == "refuse":
            return self._error(400, "prompt_logprobs is not supported for this model", "BadRequestError")
        self.requests.append(dict(body, _generated=len(out), _prefilled=len(prompt_ids) if wants_prompt_logprobs else 0, _rendered=prompt,
                                  _prompt_ids=prompt_ids, _generated_ids=out))
        usage: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out), "total_tokens": len(prompt_ids) + len(out)}
        self.requests[-1]["_usage"] = usage  # (the simulator adds what its cache held, before it is sent)
        prediction = body.get("prediction")
        if self.predicted_outputs and isinstance(prediction, dict) and isinstance(prediction.get("content"), str):
            # Predicted Outputs' accounting, simplified: the predicted tokens
            # the output begins with are accepted, the rest rejected.
            predicted = tok.encode(prediction["content"])
            accepted = next((k for k, (a, b) in enumerate(zip(out, predicted)) if a != b), min(len(out), len(predicted)))
            usage["completion_tokens_details"] = {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": len(predicted) - accepted}
        # llama-server's answer to a prefill repeats the prefilled text before
        # the new text (in the first chunk, when streaming); logprobs cover
        # only the new tokens.
        repeated = messages[-1]["content"] if continue_final and self.chat_prefill == "llama" else ""
        if body.get("stream"):
            chunks = self._chat_chunks(answer, usage, body, prompt_ids)
            if repeated:
                first = next((c for c in chunks[1:] if c["choices"][0]["delta"].get("content") is not None), None)
                if first is None:  # an answer with no text at all: the repeat comes alone
                    first = chunks[0]
                    first["choices"][0]["delta"]["content"] = ""
                first["choices"][0]["delta"]["content"] = repeated + first["choices"][0]["delta"]["content"]
            return 200, {}, chunks
        text = repeated + text
        if self.chat_prefill == "vllm" and body.get("echo") and continue_final:
            text = messages[-1]["content"] + text
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish, "logprobs": None}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": self._content_logprobs(self._rendered(out, self._rankings(prompt_ids, out)))}
        answer = {"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model_name, "choices": [choice], "usage": usage}
        if wants_prompt_logprobs:
            answer["prompt_logprobs"] = self._prompt_logprobs(prompt_ids)
        return 200, answer, None

    def _content_logprobs(self, entries: list[tuple[int, str, float | None, dict | None]]) -> list[dict]:
        """Logprobs in the chat (and llama.cpp's) ``content`` list format.
        llama.cpp gives each top candidate its own bytes (the chosen token's
        own, where its entry's text holds pieces before it)."""
        own = {}
        for token, _, _, top in entries:
            if self.token_form == "llama" and top:
                own[token] = list(self.tokenizer.token_bytes(token))
        return [
            {"id": token, "token": text, "bytes": list(text.encode("utf-8", "surrogatepass")), "logprob": lp,
             "top_logprobs": [dict({"token": t, "logprob": v}, **({"bytes": own[token]} if token in own and v == lp else {}))
                              for t, v in (top or {}).items()]}
            for token, text, lp, top in entries
        ]

    def _prompt_logprobs(self, prompt_ids: list[int]) -> list[dict | None]:
        """vLLM's ``prompt_logprobs=1``: per prompt position, the prompt's own
        token and the model's top choice, keyed by token id, with rank."""
        st = self.model.state([])
        form = self.prompt_form
        raws = [self.tokenizer.token_bytes(t) for t in prompt_ids]
        entries: list[dict | None] = []
        for i, token in enumerate(prompt_ids):
            if i == 0:
                entries.append(None)
            else:
                (t1, lp1), (t2, lp2) = st.ranked()
                own = lp1 if token == t1 else lp2 if token == t2 else lp2 - 3.0 - (token % 5) / 10.0
                rank = 1 if token == t1 else 2 if token == t2 else 3 + token % 7
                entry = {str(token): {"logprob": own, "rank": rank, "decoded_token": forms.token_string(form, raws, i, token)}}
                if token != t1:
                    entry[str(t1)] = {"logprob": lp1, "rank": 1, "decoded_token": self._candidate(raws, i, t1, form)}
                entries.append(entry)
            st.append(token)
        return entries

    def _chat_chunks(self, answer: "_Answer", usage: dict, body: dict, prompt_ids: list[int] | None = None) -> list[dict]:
        """The completions stream's pieces, as chat deltas."""
        chunks = [{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": self.model_name,
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}]}]
        for chunk in self._stream_chunks(answer, usage, dict(body, logprobs=1 if body.get("logprobs") else None), content_format=True, prompt_ids=prompt_ids):
            choice = chunk["choices"][0]
            delta = {"content": choice["text"]} if choice["text"] or choice["finish_reason"] is None else {}
            converted = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": self.model_name,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"], "logprobs": choice["logprobs"]}]}
            if "usage" in chunk:
                converted["usage"] = chunk["usage"]
            chunks.append(converted)
        return chunks

    def _complete(self, body: dict) -> tuple[int, dict, list | None]:
        tok = self.tokenizer
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            return self._error(400, "prompt must be a string", "BadRequestError")
        max_tokens = int(body.get("max_tokens", 16))
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        logprobs = body.get("logprobs")
        echo = bool(body.get("echo")) and self.echo == "yes"
        prompt_ids = tok.encode(prompt)
        if (refused := self._too_long(prompt_ids, max_tokens)) is not None:
            return refused
        answer = self._decode(prompt_ids, max_tokens, stop)
        out = answer.ids
        record = dict(body, _generated=len(out), _prefilled=len(prompt_ids) if echo else 0, _prompt_ids=prompt_ids, _generated_ids=out)
        self.requests.append(record)
        usage = record["_usage"] = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out), "total_tokens": len(prompt_ids) + len(out)}
        if body.get("stream"):
            return 200, {}, self._stream_chunks(answer, usage, body, prompt_ids=prompt_ids)
        text = answer.shown(stream=False)
        choice: dict[str, Any] = {"index": 0, "text": (prompt + text) if echo else text, "finish_reason": answer.finish, "logprobs": None}
        if logprobs is not None:
            entries = (self._rendered(prompt_ids, self._rankings([], prompt_ids), self.prompt_form) if echo else []) + self._rendered(out, self._rankings(prompt_ids, out))
            if self.token_form == "llama":
                choice["logprobs"] = {"content": self._content_logprobs(entries)}
            else:
                choice["logprobs"] = self._legacy_logprobs(entries)
        answer = {"id": "cmpl-fake", "object": "text_completion", "model": self.model_name, "choices": [choice], "usage": usage}
        if self.token_form == "llama":
            answer["timings"] = {"predicted_n": len(out)}  # llama.cpp's server sends its timings
            answer["system_fingerprint"] = LLAMA_FINGERPRINT
        return 200, answer, None

    def _sglang(self, body: dict) -> tuple[int, dict, list | None]:
        """SGLang's ``/generate``, as its documentation shapes it: ``text`` and
        ``sampling_params`` in; the answer's ``text`` and ``meta_info`` with
        ``[logprob, token_id, token_text]`` lists for the prompt (from
        ``logprob_start_len``; the first has no logprob) and the output, and
        the top ``top_logprobs_num`` per position.  (Top candidates' ids are
        not kept by the fake: null.)"""
        prompt, params = body["text"], body.get("sampling_params") or {}
        if not isinstance(prompt, str) or not isinstance(params, dict):
            return self._error(400, "text must be a string and sampling_params an object", "BadRequestError")
        stop = params.get("stop") or []
        prompt_ids = self.tokenizer.encode(prompt)
        answer = self._decode(prompt_ids, int(params.get("max_new_tokens", 128)), [stop] if isinstance(stop, str) else list(stop))
        out, scored = answer.ids, bool(body.get("return_logprob"))
        self.requests.append(dict(body, _generated=len(out), _prefilled=len(prompt_ids) if scored else 0, _prompt_ids=prompt_ids, _generated_ids=out))
        meta: dict[str, Any] = {"id": "fake", "prompt_tokens": len(prompt_ids), "completion_tokens": len(out), "cached_tokens": 0,
                                "finish_reason": {"type": answer.finish} if answer.finish != "stop" else {"type": "stop", "matched": None}}
        if scored:
            start = max(0, int(body.get("logprob_start_len", -1))) if int(body.get("logprob_start_len", -1)) >= 0 else len(prompt_ids)
            listed = lambda entries: [[lp, token, text if body.get("return_text_in_logprobs") else None] for token, text, lp, _ in entries]
            tops = lambda entries: [None if top is None else [[lp, None, text] for text, lp in sorted(top.items(), key=lambda kv: -kv[1])][: int(body.get("top_logprobs_num", 0))]
                                    for _, _, _, top in entries]
            prompt_entries = self._rendered(prompt_ids, self._rankings([], prompt_ids), self.prompt_form)[start:]
            out_entries = self._rendered(out, self._rankings(prompt_ids, out))
            meta |= {"input_token_logprobs": listed(prompt_entries), "output_token_logprobs": listed(out_entries)}
            if body.get("top_logprobs_num"):
                meta |= {"input_top_logprobs": tops(prompt_entries), "output_top_logprobs": tops(out_entries)}
        return 200, {"text": answer.shown(stream=False), "meta_info": meta}, None

    def _tgi(self, body: dict) -> tuple[int, dict, list | None]:
        """TGI's ``/generate``, as its documentation shapes it: ``inputs`` and
        ``parameters`` in; ``generated_text`` and ``details`` out, with
        ``prefill`` (each prompt token's own logprob: no top candidates; the
        first none) under ``decoder_input_details``, ``tokens`` (``special``
        marks the end of text) and ``top_tokens`` under ``top_n_tokens``."""
        params = body.get("parameters") or {}
        stop = params.get("stop") or []
        prompt_ids = self.tokenizer.encode(body["inputs"])
        answer = self._decode(prompt_ids, int(params.get("max_new_tokens") or 20), list(stop))
        out, listed = answer.ids, bool(params.get("decoder_input_details"))
        self.requests.append(dict(body, _generated=len(out), _prefilled=len(prompt_ids) if listed else 0, _prompt_ids=prompt_ids, _generated_ids=out))
        eos = self.tokenizer.eos_id
        finish = "length" if answer.finish == "length" else "eos_token" if out and out[-1] == eos else "stop_sequence"
        details: dict[str, Any] = {"finish_reason": finish, "generated_tokens": len(out), "seed": None}
        if params.get("details"):
            rendered = self._rendered(prompt_ids, self._rankings([], prompt_ids), self.prompt_form) if listed else []
            details["prefill"] = [{"id": token, "text": text, "logprob": lp} for (token, text, _, _), lp in zip(rendered, self._own_logprobs(prompt_ids))]
            entries = self._rendered(out, self._rankings(prompt_ids, out))
            details["tokens"] = [{"id": token, "text": text, "logprob": lp, "special": token == eos} for token, text, lp, _ in entries]
            if params.get("top_n_tokens"):
                details["top_tokens"] = [[{"id": None, "text": t, "logprob": v, "special": False} for t, v in sorted((top or {}).items(), key=lambda kv: -kv[1])]
                                         [: int(params["top_n_tokens"])] for _, _, _, top in entries]
        return 200, {"generated_text": answer.shown(stream=False), "details": details}, None

    def _own_logprobs(self, ids: list[int]) -> list[float | None]:
        """The model's logprob of each of ``ids`` after those before it (as
        ``_prompt_logprobs`` reports them); None for the first."""
        lps: list[float | None] = [None] if ids else []
        for token, ranked in zip(ids[1:], self._rankings([], ids)[1:]):
            (t1, lp1), (t2, lp2) = ranked  # type: ignore[misc]
            lps.append(lp1 if token == t1 else lp2 if token == t2 else lp2 - 3.0 - (token % 5) / 10.0)
        return lps

    def _rankings(self, before: list[int], ids: list[int]) -> list[tuple | None]:
        """The model's top two at each of ``ids``' positions, after ``before``
        (None at the very first position of a text: nothing predicts it)."""
        st = self.model.state(before)
        ranked: list[tuple | None] = []
        for token in ids:
            ranked.append(st.ranked() if st.ids else None)
            st.append(token)
        return ranked

    def _candidate(self, raws: list[bytes], k: int, token: int, form: str | None = None) -> str:
        """How a candidate for position ``k`` shows in top_logprobs."""
        form = form or self.token_form
        if token == self.tokenizer.eos_id:
            return "" if form == "llama" else EOS_TEXT
        return forms.candidate_string(form, raws, k, self.tokenizer.token_bytes(token), token)

    @property
    def prompt_form(self) -> str:
        """How an echoed prompt's tokens show: vLLM 0.10 corrected only
        sampled tokens' strings (its prompt logprobs decode each alone)."""
        return "vllm-legacy" if self.token_form in ("llama", "vllm-0.10") else self.token_form

    def _rendered(self, ids: list[int], ranked: list[tuple | None], form: str | None = None) -> list[tuple[int, str, float | None, dict | None]]:
        """Logprobs entries (token id, string, logprob, top dict) for ``ids``,
        as ``form`` (``token_form`` unless given) shows them.  llama.cpp lists
        only the tokens that leave the text whole, each with the text of
        those it left out."""
        tok, form = self.tokenizer, form or self.token_form
        raws = [tok.token_bytes(t) for t in ids]
        if form == "llama":
            body = len(ids) - (1 if ids and ids[-1] == tok.eos_id else 0)
            groups = forms.llama_entries(raws[:body]) + ([(body, body)] if body < len(ids) else [])
        else:
            groups = [(k, k) for k in range(len(ids))]
        entries = []
        for first, last in groups:
            token = ids[last]
            if token == tok.eos_id:
                text = "" if form == "llama" else EOS_TEXT
            elif form == "llama":
                text = forms.lossy(b"".join(raws[first : last + 1]))
            else:
                text = forms.token_string(form, raws, last, token)
            if ranked[last] is None:
                entries.append((token, text, None, None))
                continue
            (t1, lp1), (t2, lp2) = ranked[last]
            own = lp1 if token == t1 else lp2 if token == t2 else lp2 - 3.0 - (token % 5) / 10.0
            if form == "vllm-0.10" and token != tok.eos_id:
                # The sampled token first, then the top-1: strings by id,
                # the later entry's winning (see ``forms.vllm010_corrected``).
                listed = [(token, raws[last])] + ([(t1, tok.token_bytes(t1))] if t1 != tok.eos_id else [])
                strings = forms.vllm010_corrected(raws, last, listed)
                text = strings[token]
                top = {strings.get(t1, EOS_TEXT): lp1}
                top[text] = own
                entries.append((token, text, own, top))
                continue
            # vLLM builds the dict from ids, then decodes keys: colliding
            # strings keep the later entry.  The chosen token goes in last.
            top = {self._candidate(raws, last, t1, form): lp1}
            top[self._candidate(raws, last, token, form)] = own
            entries.append((token, text, own, top))
        return entries

    def _legacy_logprobs(self, entries: list[tuple[int, str, float | None, dict | None]]) -> dict:
        """The legacy completions format; ``text_offset`` is the running sum
        of the token strings' lengths (so it is wrong after a lossy one)."""
        offsets, offset = [], 0
        for _, text, _, _ in entries:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": [e[1] for e in entries], "token_logprobs": [e[2] for e in entries],
                "top_logprobs": [e[3] for e in entries], "text_offset": offsets}

    def _stream_chunks(self, answer: "_Answer", usage: dict, body: dict, content_format: bool = False, prompt_ids: list[int] | None = None) -> list[dict]:
        """One chunk per token, as vLLM streams with logprobs (even for a token
        that shows no text); without logprobs, only chunks with text.  In
        llama.cpp's form, one per token that leaves the text whole."""
        chunks, sent, shown = [], "", ""
        final = answer.shown(stream=True)
        with_logprobs = body.get("logprobs") is not None
        # llama.cpp's entries carry their top candidates (with their bytes).
        ranked = self._rankings(prompt_ids, answer.ids) if self.token_form == "llama" and with_logprobs and prompt_ids is not None else [None] * len(answer.ids)
        entries = self._rendered(answer.ids, ranked)
        ends = [last for last in range(len(answer.ids))] if self.token_form != "llama" else None
        if ends is None:
            raws = [self.tokenizer.token_bytes(t) for t in answer.ids]
            body_len = len(answer.ids) - (1 if answer.ids and answer.ids[-1] == self.tokenizer.eos_id else 0)
            ends = [last for _, last in forms.llama_entries(raws[:body_len])] + ([body_len] if body_len < len(answer.ids) else [])
        steps = answer.steps
        k = 0
        for entry, last in zip(entries, ends):
            while k <= last and k < len(steps):
                shown += steps[k]
                k += 1
            # Stop truncation caps what is visible.
            visible = final[: len(shown)]
            if with_logprobs:
                if content_format or self.token_form == "llama":
                    logprobs = {"content": self._content_logprobs([entry])}
                else:
                    logprobs = {"tokens": [entry[1]], "token_logprobs": [None], "top_logprobs": [None]}
                chunks.append(self._chunk(visible[len(sent) :], None, logprobs))
                if self.token_form == "llama" and self.timings_per_token and body.get("timings_per_token"):
                    chunks[-1]["timings"] = {"predicted_n": last + 1}  # llama.cpp: tokens generated so far
                sent = visible
            elif len(visible) > len(sent):
                chunks.append(self._chunk(visible[len(sent) :], None))
                if self.token_form == "llama" and self.timings_per_token and body.get("timings_per_token"):
                    chunks[-1]["timings"] = {"predicted_n": last + 1}
                sent = visible
        if self.speculates and with_logprobs and not content_format and self.token_form != "llama":
            chunks = _merged_steps(chunks, self._accepted_runs(prompt_ids or [], answer.ids))
        if len(final) > len(sent):
            chunks.append(self._chunk(final[len(sent) :], None))
        last_chunk = self._chunk("", answer.finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            last_chunk["usage"] = usage
        chunks.append(last_chunk)
        return chunks

    def _accepted_runs(self, prompt_ids: list[int], ids: list[int]) -> list[int]:
        """How many of ``ids`` each step of a self-speculating server sends:
        the first alone (prefill), then each step its draft's accepted
        tokens plus its own."""
        runs, i = [1], 1
        while i < len(ids):
            context = prompt_ids + ids[:i]
            draft = _ngram_draft(context, self.speculates)
            accepted = 0
            while accepted < len(draft) and i + accepted < len(ids) and draft[accepted] == ids[i + accepted]:
                accepted += 1
            step = min(accepted + 1, len(ids) - i)
            runs.append(step)
            i += step
        return runs

    def _chunk(self, text: str, finish: str | None, logprobs: dict | None = None) -> dict:
        chunk = {"id": "cmpl-fake", "object": "text_completion", "model": self.model_name,
                 "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}]}
        if self.token_form == "llama":
            chunk["system_fingerprint"] = LLAMA_FINGERPRINT  # llama.cpp's build info, in every chunk
        return chunk

    # -- a real HTTP server, for subprocess tests and demos ------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0, *, faults: Faults | None = None, hang_s: float = 5.0) -> ThreadingHTTPServer:
        """Start serving in a daemon thread; returns the server (``server_address`` has the port).

        Streams go out one chunk at a time, ``decode_s`` apart, so a client
        can close one part-way (the server then stops writing, as vLLM
        aborts the request).  ``faults`` are injected as a remote API shows
        them (see :mod:`.faults`); a "timeout" holds the request ``hang_s``
        seconds before closing it unanswered.  ``GET /fake/stats`` reports
        requests in flight (and the most at once), served, and faults injected.
        """
        fake = self
        lock = threading.Lock()
        counts = {"in_flight": 0, "peak_in_flight": 0, "served": 0}

        class Handler(BaseHTTPRequestHandler):
            def _run(self) -> None:
                with lock:
                    counts["in_flight"] += 1
                    if not self.path.endswith("/fake/stats"):
                        counts["peak_in_flight"] = max(counts["peak_in_flight"], counts["in_flight"])
                try:
                    self._serve()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client closed the request (fan-out and branches do): fine
                finally:
                    with lock:
                        counts["in_flight"] -= 1
                        counts["served"] += 1

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                if self.path.endswith("/fake/stats"):
                    with lock:
                        stats = dict(counts, in_flight=counts["in_flight"] - 1, faults=faults.summary() if faults else None)
                    return self._send(200, json.dumps(stats).encode(), "application/json")
                fault = None
                if faults is not None and self.command == "POST":
                    try:
                        fault = faults.draw(json.loads(body or b"{}").get("prompt"))
                    except (ValueError, AttributeError):
                        fault = faults.draw()
                if fault == "429":
                    return self._send(429, b'{"error": {"message": "rate limited (injected)"}}', "application/json", {"retry-after": "0"})
                if fault == "500":
                    return self._send(500, b'{"error": {"message": "internal error (injected)"}}', "application/json")
                if fault == "timeout":
                    time.sleep(hang_s)
                    return self._reset()
                with lock:  # so the record we cost is this request's own
                    before = len(fake.requests)
                    status, payload, chunks = fake._dispatch(self.command, self.path, self.headers, body)
                    record = fake.requests[before] if len(fake.requests) > before else None
                if chunks is None:
                    if record is not None:  # a completion: simulate its cost, concurrently
                        time.sleep(fake._simulated_seconds(record))
                    if fault == "reset":
                        return self._reset()
                    return self._send(status, json.dumps(payload).encode(), "application/json")
                time.sleep(fake.latency)
                self.send_response(status)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()  # no length: the stream ends when the connection closes
                cut = len(chunks) // 2 if fault == "reset" else None
                for k, chunk in enumerate(chunks):
                    if k == cut:
                        return self._reset()
                    time.sleep(fake.decode_s)
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

            def _send(self, status: int, data: bytes, ctype: str, headers: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _reset(self) -> None:
                """Close the connection with a TCP reset, mid-answer or before it."""
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True

            do_GET = do_POST = _run

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # every request is a new connection (HTTP/1.0): take bursts
            daemon_threads = True

        server = Server((host, port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def main() -> None:  # pragma: no cover - exercised by the CLI subprocess tests
    import argparse

    parser = argparse.ArgumentParser(prog="python -m blackbox_spec.testing", description="Serve the deterministic fake target over HTTP.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--echo", choices=["yes", "refuse", "ignore"], default="yes")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="simulated cost of every request")
    parser.add_argument("--decode-ms", type=float, default=0.0, help="simulated cost per generated token")
    parser.add_argument("--prefill-ms", type=float, default=0.0, help="simulated cost per echoed prompt token")
    parser.add_argument("--deviate-every", type=int, default=9, help="how rarely the model stops copying its context")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="share of requests that fail (429, 500, timeout, reset)")
    parser.add_argument("--fault-kinds", nargs="+", default=None, help="which faults to inject (default: all four)")
    parser.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draw")
    parser.add_argument("--hang-s", type=float, default=5.0, help="how long a 'timeout' fault holds the request")
    parser.add_argument("--api-key", default=None, help="require this bearer key")
    parser.add_argument("--context-window", type=int, default=None, help="refuse prompt + max_tokens beyond this many tokens")
    parser.add_argument("--byte-level", action="store_true", help="a byte-level tokenizer: tokens that split characters")
    parser.add_argument("--token-form", choices=forms.FORMS, default="vllm-legacy",
                        help="how logprobs show tokens that split characters (the servers' conventions, testing/forms.py)")
    parser.add_argument("--stop-rule", choices=["first-listed", "earliest-end", "earliest-start"], default="first-listed",
                        help="which stop string wins when several complete at once")
    parser.add_argument("--chat-prefill", choices=["vllm", "llama", "trailing", "tgi", "prefix", "none"], default="vllm",
                        help="how chat treats a final assistant message: vLLM's continue_final_message, llama.cpp's prefill (repeated), "
                             "continued as it is (Groq), continued with its trailing whitespace trimmed (TGI), only with \"prefix\": true on it "
                             "(Mistral, DeepSeek), or a new turn (OpenAI)")
    parser.add_argument("--no-completions", action="store_true", help="serve chat only (/completions answers 404, as hosted APIs do)")
    parser.add_argument("--sglang-generate", action="store_true", help="serve SGLang's native /generate at the root, which scores prompts "
                        "(with --echo ignore, as SGLang's /v1/completions echo gives no prompt logprobs)")
    parser.add_argument("--tgi-generate", action="store_true", help="serve TGI's native /generate at the root, whose details list "
                        "each prompt token's own logprob (with --echo ignore and --chat-prefill tgi, as TGI itself)")
    args = parser.parse_args()
    model = FakeModel(FakeTokenizer(byte_level=args.byte_level), deviate_every=args.deviate_every)
    fake = FakeTarget(model_name=args.model, echo=args.echo, model=model, latency=args.latency_ms / 1000,
                      decode_s=args.decode_ms / 1000, prefill_s=args.prefill_ms / 1000, api_key=args.api_key,
                      context_window=args.context_window, token_form=args.token_form, stop_rule=args.stop_rule,
                      chat_prefill=args.chat_prefill, completions=not args.no_completions, sglang_generate=args.sglang_generate,
                      tgi_generate=args.tgi_generate)
    faults = None
    if args.fault_rate:
        faults = Faults(rate=args.fault_rate, seed=args.fault_seed, **({"kinds": tuple(args.fault_kinds)} if args.fault_kinds else {}))
    server = fake.serve(port=args.port, faults=faults, hang_s=args.hang_s)
    print(f"fake target on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    threading.Event().wait()

